//! The only module that writes to the API server. Every write is gated on leadership *at the moment it
//! is sent*, so a replica that lost the lease stops at once, even in the middle of a plan. Failed writes
//! (5xx, 429, timeouts, conflicts) back off per object with exponential delay; they are never a node or
//! revision failure — the next reconcile simply computes the same intent again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};
use netwave_api::{
    ASSIGNED_AT_ANNOTATION, InputStatus, NODE_PHASE_PENDING, NetworkConfigInputs,
    NetworkConfigRevision, NetworkConfigRevisionSpec, NetworkConfigRevisionStatus,
    NodeNetworkConfig, NodeNetworkConfigSpec, QUEUED_ANNOTATION, RevisionInputs,
};
use netwave_core::render::InputKind;
use netwave_core::revision::{DESTRUCTIVE_CHANGE_ANNOTATION, DESTRUCTIVE_CHANGE_BASIS_ANNOTATION};
use netwave_core::rollout::NodeRecord;
use netwave_core::rollout::hold::HoldRecord;
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::lease::LeaderGate;
use crate::metrics::{ApiErrorLabels, Metrics, Verb};

/// Events that failed to send are retried with the next batch, up to this many.
const MAX_PENDING_EVENTS: usize = 200;

/// Node config assignments of one plan sent at once: they are independent of each other (any subset
/// of a plan's assignments is within its budget), and one at a time they made a reconcile of a
/// 5,000-node rollout wait ~4 ms per node for the API server (#14). Everything else stays in order.
pub(crate) const CONCURRENT_NODE_WRITES: usize = 32;

/// Field manager of every configurator write (server-side apply ownership).
pub const FIELD_MANAGER: &str = netwave_api::vocab::managers::CONFIGURATOR;

/// One write the reconcile wants done.
#[derive(Clone, Debug, PartialEq)]
pub enum Intent {
    /// A revision, then its inputs (a `NetworkConfigInputs` of the same name, owned by it).
    CreateRevision {
        name: String,
        spec: Box<NetworkConfigRevisionSpec>,
        inputs: Box<RevisionInputs>,
        /// Created held as a destructive change (`spec.paused` is set in `spec`): the annotations.
        hold: Option<HoldRecord>,
    },
    /// Hold a revision as a destructive change: `spec.paused: true` and the annotations saying what it
    /// removes and against which last good revision (`rollout::hold`), in one patch, over the revision
    /// as the step read it (its resourceVersion): an admin's resume that came in between is never
    /// undone by a hold decided on an older view (the conflict is retried on a fresh one).
    HoldRevision {
        hold: HoldRecord,
        resource_version: Option<String>,
    },
    /// Put back a revision's `spec.hash` and its inputs, which someone edited or deleted (see
    /// `integrity`).
    RestoreRevisionSpec {
        name: String,
        hash: String,
        inputs: Box<RevisionInputs>,
    },
    /// Make an older good revision the target again under the next sequence, in its status (its spec
    /// never changes): `activeSequence`, `reactivatedAt`, and a fresh rollout (`Pending`, no start,
    /// completion or failures of the earlier one), so it reads `Progressing` until its nodes are back.
    ReactivateRevision { name: String, status: Reactivation },
    /// A node's record (failure streak, quarantine; `rollout::quarantine`): both annotations of its
    /// NodeNetworkConfig, a missing one removed. The agent cannot write them.
    NodeRecord { node: String, record: NodeRecord },
    /// The `Quarantined` condition of a node's NodeNetworkConfig status (`None`: none), server-side
    /// applied by the configurator, which owns only that field of the status.
    NodeCondition {
        node: String,
        condition: Option<Condition>,
    },
    /// Server-side apply of a node's whole spec (creates the NNC if missing) and its assignment time.
    /// `clear_queued`: the object may be (or may still be, as far as the cache knows) a placeholder
    /// whose create set `netwave.dev/queued`: the same apply sets it empty (an apply cannot remove a
    /// field a create owns, but takes it over), and the node's next assignment, which leaves it out,
    /// removes it. No separate write either way.
    ///
    /// `based_on`: the node config's resourceVersion in the view the plan was made on (`None`: not in
    /// it). The same spec planned again on that same view — the cache has not shown this replica's own
    /// write yet — is not sent again ([`Writer::execute`]).
    ///
    /// `assigned_at`: `None` for the plan's assignments, stamped when the write is sent. The pickup and
    /// apply deadlines count from it, and a plan's writes can wait in line for a while on a slow API
    /// server (kube-apiserver at 15,000 nodes took tens of seconds for a first wave of 1,500): time the
    /// agent never had. `Some` keeps a time already on record (a tampered spec put back).
    ///
    /// `pending`: the plan's view of the node's status says something else than this spec
    /// (`Provisioned` for the config before a re-render under the same revision, or `Queued` from a
    /// placeholder an older configurator marked so): the message of the `Pending` mark written after
    /// the apply, so the node does not read as running a config it has not been given. `None`: the
    /// status tells no lie (a first assignment has none).
    ApplyNodeConfig {
        node: String,
        spec: Box<NodeNetworkConfigSpec>,
        assigned_at: Option<String>,
        clear_queued: bool,
        based_on: Option<String>,
        pending: Option<String>,
    },
    /// Server-side apply of a revision's whole status: fields omitted now are removed.
    RevisionStatus {
        name: String,
        status: Arc<NetworkConfigRevisionStatus>,
    },
    /// A revision and its inputs.
    DeleteRevision { name: String },
    /// Server-side apply of an input object's whole status (its verdict, nodes, table).
    ///
    /// `based_on`: the object's resourceVersion in the view the plan was made on. The same status
    /// planned again on that view (the cache has not shown this replica's write yet) is not sent
    /// again, as for node configs.
    InputStatus {
        kind: InputKind,
        name: String,
        status: Box<InputStatus>,
        based_on: Option<String>,
    },
    /// A placeholder NodeNetworkConfig for a node without an assignment, created (when
    /// `resource_version` is `None`) with `netwave.dev/queued` saying what the node waits for: one
    /// write. An existing placeholder whose message changed gets the new one over the object as read
    /// (its resourceVersion), never over an assignment that came in between.
    QueueNode {
        node: String,
        message: String,
        resource_version: Option<String>,
    },
    /// The node left the cluster.
    DeleteNodeConfig { name: String },
    Event {
        regarding: ObjectReference,
        type_: EventType,
        reason: String,
        action: String,
        note: String,
    },
}

impl Intent {
    /// Backoff key: one per object written.
    pub(crate) fn key(&self) -> String {
        match self {
            Intent::CreateRevision { name, .. }
            | Intent::HoldRevision {
                hold: HoldRecord { revision: name, .. },
                ..
            }
            | Intent::RestoreRevisionSpec { name, .. }
            | Intent::DeleteRevision { name } => format!("ncr/{name}"),
            Intent::ReactivateRevision { name, .. } => format!("ncr-status/{name}"),
            Intent::RevisionStatus { name, .. } => format!("ncr-status/{name}"),
            Intent::InputStatus { kind, name, .. } => format!("{}-status/{name}", kind.as_str()),
            Intent::ApplyNodeConfig { node: name, .. }
            | Intent::QueueNode { node: name, .. }
            | Intent::DeleteNodeConfig { name } => {
                format!("nnc/{name}")
            }
            Intent::NodeRecord { node, .. } => format!("nnc-record/{node}"),
            Intent::NodeCondition { node, .. } => format!("nnc-condition/{node}"),
            Intent::Event {
                regarding, reason, ..
            } => {
                format!(
                    "event/{}/{reason}",
                    regarding.name.as_deref().unwrap_or_default()
                )
            }
        }
    }

    fn verb(&self) -> Verb {
        match self {
            Intent::CreateRevision { .. }
            | Intent::Event { .. }
            | Intent::QueueNode {
                resource_version: None,
                ..
            } => Verb::create,
            Intent::DeleteRevision { .. } | Intent::DeleteNodeConfig { .. } => Verb::delete,
            _ => Verb::patch,
        }
    }
}

/// What reactivating an older good revision writes in its status (a merge patch: its spec never
/// changes), as the plan decided it (`decide::reactivation`): the next sequence as `activeSequence`,
/// `reactivatedAt`, and a fresh rollout (the `None`s and the empty list clear the earlier one's), so
/// it reads `Progressing` until its nodes are back.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reactivation {
    pub active_sequence: u64,
    pub reactivated_at: String,
    pub phase: &'static str,
    pub started_at: Option<String>,
    pub completed_at: Option<String>,
    pub canaries_updated_at: Option<String>,
    pub last_progress_at: Option<String>,
    pub failed_nodes: Vec<String>,
    pub failed: u32,
}

/// The `Pending` mark the plan put on an assignment ([`Intent::ApplyNodeConfig`]'s `pending`),
/// written over the object the apply returned (its resourceVersion is the precondition). Sent only
/// while that object's status is still stale for its spec as the plan saw it: an assignment sent
/// again (the cache had not shown the first yet) finds `Pending` already and writes nothing, one
/// status write per transition, and a report the agent made in between is never hidden.
async fn mark_pending(
    nncs: &Api<NodeNetworkConfig>,
    written: &NodeNetworkConfig,
    message: &str,
) -> Result<(), kube::Error> {
    let stale = written
        .status
        .as_ref()
        .is_some_and(|st| st.stale_for(&written.spec).is_some());
    if !stale {
        return Ok(());
    }
    let name = written.metadata.name.as_deref().unwrap_or_default();
    let rv = written.metadata.resource_version.as_deref();
    write_node_phase(nncs, name, rv, NODE_PHASE_PENDING, message).await
}

/// Writes a NodeNetworkConfig's phase and message (and transition time) over the object as read: its
/// resourceVersion is a precondition, so an agent report that came first is never overwritten (that
/// conflict is no failure: the newer report stands). Only fields every agent report sets are written,
/// so the agent's next report (server-side apply) replaces all of them.
async fn write_node_phase(
    nncs: &Api<NodeNetworkConfig>,
    name: &str,
    resource_version: Option<&str>,
    phase: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let patch = json!({
        "metadata": { "resourceVersion": resource_version },
        "status": {
            "phase": phase,
            "message": message,
            "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now()
            ),
        },
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    match nncs
        .patch_status(name, &params, &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(()),
        r => r.map(drop),
    }
}

/// The server-side apply of a node's spec, serialized straight from the spec: a `json!` of it built
/// a tree of the whole config first, per node of a rollout (#28).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecApply<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: SpecApplyMeta<'a>,
    spec: &'a NodeNetworkConfigSpec,
}

#[derive(Debug, serde::Serialize)]
struct SpecApplyMeta<'a> {
    name: &'a str,
    annotations: BTreeMap<&'static str, &'a str>,
}

/// The annotations that record a hold on a revision.
fn hold_annotations(h: &HoldRecord) -> std::collections::BTreeMap<String, String> {
    [
        (DESTRUCTIVE_CHANGE_ANNOTATION.to_string(), h.summary.clone()),
        (
            DESTRUCTIVE_CHANGE_BASIS_ANNOTATION.to_string(),
            h.basis.clone(),
        ),
    ]
    .into()
}

/// The label on every object the configurator creates.
fn managed_by() -> std::collections::BTreeMap<String, String> {
    [(
        "app.kubernetes.io/managed-by".to_string(),
        FIELD_MANAGER.to_string(),
    )]
    .into()
}

/// A create by the configurator's field manager.
fn create_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// Makes the `NetworkConfigInputs` of `revision` hold `inputs`: created owned by the revision; one
/// already there with the same inputs (a previous attempt's) is kept; one with other inputs (edited, or
/// left over from a deleted revision of the same name) is replaced. Inputs are immutable on the API
/// server, so replacing is delete and create, the delete conditional on the uid read.
async fn put_inputs(
    client: &Client,
    revision: &NetworkConfigRevision,
    inputs: &RevisionInputs,
) -> Result<(), kube::Error> {
    let api: Api<NetworkConfigInputs> = Api::all(client.clone());
    let name = revision.metadata.name.as_deref().unwrap_or_default();
    let mut object = NetworkConfigInputs::new(name, inputs.clone());
    object.meta_mut().labels = Some(managed_by());
    // Not blockOwnerDeletion: that needs rights on the revision's finalizers where the admission
    // plugin that checks them runs, and nothing needs the inputs to outlive the revision's deletion.
    object.meta_mut().owner_references = revision.owner_ref(&()).map(|o| vec![o]);
    let pp = create_params();
    let existing = match api.create(&pp, &object).await {
        Err(kube::Error::Api(ae)) if ae.code == 409 => api.get(name).await?,
        other => return other.map(drop),
    };
    if existing.spec == *inputs {
        return Ok(());
    }
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: existing.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &dp).await {
        Err(kube::Error::Api(ae)) if ae.code == 404 => {}
        other => drop(other?),
    }
    api.create(&pp, &object).await.map(drop)
}

/// Creates a node's placeholder saying what it waits for (`message`, in `netwave.dev/queued`) if
/// `resource_version` is `None`: one write. One that exists already (a previous attempt's, or an
/// assignment that beat us) is left alone: the next reconcile sees it and decides again. With
/// `resource_version`, puts the new `message` on the placeholder as read; a conflict means it changed
/// meanwhile (an assignment, say), and the newer object stands.
async fn queue_node(
    client: &Client,
    node: &str,
    message: &str,
    resource_version: Option<&str>,
) -> Result<(), kube::Error> {
    let sent = match resource_version {
        None => {
            let mut nnc = NodeNetworkConfig::new(node, NodeNetworkConfigSpec::placeholder());
            nnc.meta_mut().labels = Some(managed_by());
            nnc.meta_mut().annotations =
                Some([(QUEUED_ANNOTATION.to_string(), message.to_string())].into());
            let body = serde_json::to_vec(&nnc).map_err(kube::Error::SerdeError)?;
            send_unread(
                client,
                "create",
                nnc_request().create(&create_params(), body),
            )
            .await
        }
        Some(rv) => {
            let patch = json!({
                "metadata": {
                    "resourceVersion": rv,
                    "annotations": { QUEUED_ANNOTATION: message },
                },
            });
            let req = nnc_request().patch(node, &merge_params(), &Patch::Merge(&patch));
            send_unread(client, "patch", req).await
        }
    };
    match sent {
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(()),
        other => other,
    }
}

/// Requests on NodeNetworkConfigs built by hand, for the writes whose answer is read only as far as
/// the configurator uses it: kube's typed `Api` decodes the whole object it gets back (config, managed
/// fields and all), and doing that only to drop it, once per node of a rollout, was 6 % of the leader's
/// CPU at 5,000 nodes (#28). The watch brings every object into the cache anyway.
fn nnc_request() -> kube::core::Request {
    kube::core::Request::new(NodeNetworkConfig::url_path(&(), None))
}

/// Sends `req` and reads of the answer only what `T` holds (serde skips the rest without building it).
async fn send_read<T: serde::de::DeserializeOwned>(
    client: &Client,
    verb: &'static str,
    req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> Result<T, kube::Error> {
    let mut req = req.map_err(kube::Error::BuildRequest)?;
    // What kube's `Api` tags its requests with (the verb, for its tracing layer).
    req.extensions_mut().insert(verb);
    client.request(req).await
}

/// Sends `req` and drops the answer unread (an API error is still an error).
async fn send_unread(
    client: &Client,
    verb: &'static str,
    req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> Result<(), kube::Error> {
    let mut req = req.map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert(verb);
    client.request_text(req).await.map(drop)
}

/// What an assignment reads of the object its apply returned (for [`mark_pending`]): its name and
/// resourceVersion, the spec's revision fields, and the status. The config is skipped unread.
#[derive(serde::Deserialize)]
struct WrittenNodeConfig {
    metadata: WrittenMeta,
    spec: WrittenSpec,
    #[serde(default)]
    status: Option<netwave_api::NodeNetworkConfigStatus>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    name: Option<String>,
    resource_version: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenSpec {
    revision: String,
    sequence: u64,
    config_hash: String,
    #[serde(default)]
    retry: u32,
}

impl WrittenNodeConfig {
    /// The object as written, its config left empty.
    fn into_node_config(self) -> NodeNetworkConfig {
        let WrittenSpec {
            revision,
            sequence,
            config_hash,
            retry,
        } = self.spec;
        let spec = NodeNetworkConfigSpec {
            revision,
            sequence,
            config_hash,
            retry,
            config: Default::default(),
        };
        let mut nnc =
            NodeNetworkConfig::new(self.metadata.name.as_deref().unwrap_or_default(), spec);
        nnc.metadata.resource_version = self.metadata.resource_version;
        nnc.status = self.status;
        nnc
    }
}

/// One line for a person, written by the replica that did it, once it is done. Per-node writes stay at
/// debug level (a 5,000-node wave is one line from the reconcile, not 5,000).
fn log_done(intent: &Intent) {
    match intent {
        // Logged where it is created (`send`): the same intent comes again while the watch has not
        // delivered the revision yet, and finding it there is no creation.
        Intent::CreateRevision { .. } => debug!(object = %intent.key(), "written"),
        Intent::ReactivateRevision { name, status } => info!(
            revision = %name, sequence = status.active_sequence,
            "the inputs equal this earlier good revision: it is the target again"
        ),
        Intent::DeleteRevision { name } => {
            info!(revision = %name, "deleted old revision (history limit)")
        }
        // Logged by every replica when it first sees the object (`Reconciler::report_undecodable`).
        Intent::Event { reason, .. } if reason == netwave_core::undecodable::REASON => {
            debug!(object = %intent.key(), "written")
        }
        Intent::Event {
            regarding,
            type_,
            reason,
            note,
            ..
        } => {
            let object = regarding.name.as_deref().unwrap_or_default();
            match type_ {
                EventType::Warning => warn!(%object, %reason, "{note}"),
                EventType::Normal => info!(%object, %reason, "{note}"),
            }
        }
        // The NodeQuarantined or NodeFailed Event written with it is the line for a person.
        Intent::NodeRecord { node, record } => debug!(
            %node,
            streak = record.streak.len(),
            quarantined = record.is_quarantined(),
            "node record written"
        ),
        Intent::RestoreRevisionSpec { .. }
        | Intent::NodeCondition { .. }
        | Intent::HoldRevision { .. }
        | Intent::ApplyNodeConfig { .. }
        | Intent::RevisionStatus { .. }
        | Intent::InputStatus { .. }
        | Intent::QueueNode { .. }
        | Intent::DeleteNodeConfig { .. } => debug!(object = %intent.key(), "written"),
    }
}

/// Small fixed set of error categories for metrics and logs.
pub fn category(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(ae) if ae.code == 409 => "conflict",
        kube::Error::Api(ae) if ae.code == 429 => "throttled",
        kube::Error::Api(ae) if ae.code == 404 => "not_found",
        kube::Error::Api(ae) if ae.code == 422 => "invalid",
        kube::Error::Api(ae) if ae.code >= 500 => "server",
        kube::Error::Api(_) => "client",
        _ => "transport",
    }
}

#[derive(Clone, Copy, Debug)]
struct Backoff {
    failures: u32,
    next: Instant,
}

pub struct Writer {
    client: Client,
    gate: LeaderGate,
    recorder: Recorder,
    backoff: BTreeMap<String, Backoff>,
    pending_events: Vec<Intent>,
    base: Duration,
    max: Duration,
    /// write key → the last node config spec, placeholder or input status written there, on which
    /// view, and until when a plan on that same view repeats it ([`SENT_MEMORY`]).
    sent: BTreeMap<String, SentWrite>,
    /// When `sent` was last rid of what expired ([`SENT_PRUNE_EVERY`]).
    sent_pruned: Instant,
}

/// How often the writes remembered in [`Writer`]'s `sent` are rid of the expired ones (an expired
/// one is not taken as a repeat either way). Not at every execute: a leader executes about 50 times a
/// second in a rollout, and a pass over 5,000 remembered writes each time was 1.5 % of its CPU (#28).
const SENT_PRUNE_EVERY: Duration = Duration::from_secs(1);

/// What this replica wrote to an object, planned on the view `based_on` of it (`None`: the object was
/// not in it).
#[derive(Clone, Debug, PartialEq)]
struct SentWrite {
    based_on: Option<String>,
    what: Sent,
    until: Instant,
}

/// A write, as far as a repeat of it goes.
#[derive(Clone, Debug, PartialEq)]
enum Sent {
    /// An assignment: revision, sequence, retry, configHash.
    Spec((String, u64, u32, String)),
    /// A placeholder created (on no view) or its message updated (on the view it was read at), with
    /// this message. On kube-apiserver the cache shows a create some time after it; a plan in between
    /// made the same create again, which failed as a conflict (1.045 creates per node at 1,000
    /// nodes, #28).
    Queued(String),
    /// An input object's status ([`timeless`]). A plan made before the cache showed it wrote the same
    /// status twice (19-20 status writes for 18 objects in a rollout, on a loaded machine).
    Status(Box<InputStatus>),
}

/// The view and what a write sends, for the writes a plan may repeat before the cache shows them
/// (`None`: any other write).
fn sent(intent: &Intent) -> Option<(&Option<String>, Sent)> {
    match intent {
        Intent::ApplyNodeConfig { spec, based_on, .. } => {
            Some((based_on, Sent::Spec(spec_key(spec))))
        }
        Intent::QueueNode {
            message,
            resource_version,
            ..
        } => Some((resource_version, Sent::Queued(message.clone()))),
        Intent::InputStatus {
            status, based_on, ..
        } => Some((based_on, Sent::Status(Box::new(timeless(status))))),
        _ => None,
    }
}

/// An input status as far as a repeat of it goes: without its conditions' transition times. A plan on
/// a view that does not show this replica's write yet stamps the transition again, with its own time
/// (in whole seconds): planned again after the second turned, the same status read as a new one and
/// was written twice (20 status writes for 18 objects in CI, on a loaded machine).
fn timeless(status: &InputStatus) -> InputStatus {
    let mut s = status.clone();
    for c in &mut s.conditions {
        c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    }
    s
}

/// How long a write is taken as still on its way to the cache: a plan on the view it was based on
/// within this time repeats it and is not sent. Past it, the plan is trusted again (a config deleted
/// before the cache ever showed it is then written anew).
const SENT_MEMORY: Duration = Duration::from_secs(10);

fn spec_key(spec: &NodeNetworkConfigSpec) -> (String, u64, u32, String) {
    (
        spec.revision.clone(),
        spec.sequence,
        spec.retry,
        spec.config_hash.clone(),
    )
}

/// What happened to a batch of intents.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub written: usize,
    pub failed: usize,
    /// Skipped because the object is backing off.
    pub deferred: usize,
    /// Not sent because this replica is not the leader.
    pub dropped: usize,
    /// Node config specs, placeholders and input statuses not sent because this replica wrote them
    /// already on the same view (the cache had not shown that write when the plan was made).
    pub repeated: usize,
    /// The nodes whose assignment (a node config spec) was sent.
    pub assigned: Vec<String>,
    /// The earliest time a deferred or failed write may be retried.
    pub retry_at: Option<Instant>,
}

impl Writer {
    pub fn new(client: Client, gate: LeaderGate, recorder: Recorder) -> Self {
        Self {
            client,
            gate,
            recorder,
            backoff: BTreeMap::new(),
            pending_events: Vec::new(),
            base: Duration::from_millis(200),
            max: Duration::from_secs(60),
            sent: BTreeMap::new(),
            sent_pruned: Instant::now(),
        }
    }

    /// `intent` writes what this replica wrote already (a spec, a placeholder, an input status),
    /// planned on the same view of the object (within [`SENT_MEMORY`]): sending it again would only
    /// move the assignment time (or fail as a conflict), and cost the API server a write and an
    /// event for every watch of the kind.
    fn repeats(&self, intent: &Intent, now: Instant) -> bool {
        let Some((based_on, what)) = sent(intent) else {
            return false;
        };
        self.sent
            .get(&intent.key())
            .is_some_and(|s| s.based_on == *based_on && s.what == what && now < s.until)
    }

    fn remember(&mut self, intent: &Intent, now: Instant) {
        if let Some((based_on, what)) = sent(intent) {
            self.sent.insert(
                intent.key(),
                SentWrite {
                    based_on: based_on.clone(),
                    what,
                    until: now + SENT_MEMORY,
                },
            );
        }
    }

    pub fn is_leader(&self) -> bool {
        self.gate.is_leader()
    }

    /// The gate this writer writes under (a copy to wait on).
    pub fn gate(&self) -> LeaderGate {
        self.gate.clone()
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends the intents in order and stops at the first one that fails or is backing off: the plan's
    /// order is what keeps a partial application safe (a revision's `Failed` status is on record before
    /// any node is rolled back; `Validated` before any node gets it). The next reconcile recomputes the
    /// rest. Events go last and do not stop anything; a failed one is kept and retried.
    /// Stops at the first intent found without leadership.
    pub async fn execute(&mut self, intents: Vec<Intent>, metrics: &Metrics) -> Outcome {
        let mut out = Outcome::default();
        let (events, writes): (Vec<Intent>, Vec<Intent>) = intents
            .into_iter()
            .partition(|i| matches!(i, Intent::Event { .. }));
        let total = writes.len();
        let started = Instant::now();
        if started >= self.sent_pruned + SENT_PRUNE_EVERY {
            self.sent.retain(|_, s| s.until > started);
            self.sent_pruned = started;
        }
        let mut i = 0;
        'writes: while i < total {
            if !self.gate.is_leader() {
                out.dropped = total - i;
                metrics.writes_dropped.inc_by(out.dropped as u64);
                return out;
            }
            // A run of node config writes goes out together, up to the first one backing off:
            // assignments, and placeholders (each for a node the plan does not assign).
            let node_config =
                |x: &Intent| matches!(x, Intent::ApplyNodeConfig { .. } | Intent::QueueNode { .. });
            let mut end = i + 1;
            if node_config(&writes[i]) {
                while end < total && end - i < CONCURRENT_NODE_WRITES && node_config(&writes[end]) {
                    end += 1;
                }
            }
            let now = Instant::now();
            if let Some(k) = (i..end).find(|&k| {
                self.backoff
                    .get(&writes[k].key())
                    .is_some_and(|b| b.next > now)
            }) {
                if k == i {
                    out.deferred = total - i;
                    out.retry_at = self.backoff.get(&writes[i].key()).map(|b| b.next);
                    break;
                }
                end = k;
            }
            let this = &*self;
            let results = futures::future::join_all(writes[i..end].iter().map(|w| async move {
                if this.repeats(w, now) {
                    return Ok(false);
                }
                this.send(w).await.map(|()| true)
            }))
            .await;
            let mut failed = false;
            for (intent, result) in writes[i..end].iter().zip(results) {
                let key = intent.key();
                match result {
                    Ok(false) => {
                        debug!(object = %key, "written already on this view; not sent again");
                        out.repeated += 1;
                    }
                    Ok(true) => {
                        self.backoff.remove(&key);
                        self.remember(intent, Instant::now());
                        log_done(intent);
                        out.written += 1;
                        if let Intent::ApplyNodeConfig { node, .. } = intent {
                            out.assigned.push(node.clone());
                        }
                    }
                    Err(e) => {
                        let next = self.failed(intent, key, &e, metrics);
                        out.failed += 1;
                        out.retry_at = Some(out.retry_at.map_or(next, |t| t.min(next)));
                        failed = true;
                    }
                }
            }
            i = end;
            if failed {
                out.deferred = total - end;
                break 'writes;
            }
        }
        let mut events: Vec<Intent> = std::mem::take(&mut self.pending_events)
            .into_iter()
            .chain(events)
            .collect();
        events.truncate(MAX_PENDING_EVENTS);
        for event in events {
            if !self.gate.is_leader() {
                break;
            }
            let key = event.key();
            match self.attempt(&event, key, metrics).await {
                Ok(()) => out.written += 1,
                Err(next) => {
                    out.failed += 1;
                    out.retry_at = Some(out.retry_at.map_or(next, |t| t.min(next)));
                    self.pending_events.push(event);
                }
            }
        }
        out
    }

    /// Sends one intent; on failure records the backoff and returns when it may be retried.
    async fn attempt(
        &mut self,
        intent: &Intent,
        key: String,
        metrics: &Metrics,
    ) -> Result<(), Instant> {
        match self.send(intent).await {
            Ok(()) => {
                self.backoff.remove(&key);
                log_done(intent);
                Ok(())
            }
            Err(e) => Err(self.failed(intent, key, &e, metrics)),
        }
    }

    /// Counts a failed write and records its backoff; returns when it may be retried.
    fn failed(
        &mut self,
        intent: &Intent,
        key: String,
        e: &kube::Error,
        metrics: &Metrics,
    ) -> Instant {
        let category = category(e);
        metrics
            .api_errors
            .get_or_create(&ApiErrorLabels {
                verb: intent.verb(),
                category,
            })
            .inc();
        let failures = self.backoff.get(&key).map_or(0, |b| b.failures) + 1;
        let delay = self
            .base
            .saturating_mul(1 << failures.min(16))
            .min(self.max);
        let next = Instant::now() + delay;
        warn!(object = %key, category, error = %e, retry_in = ?delay, "write failed; will retry");
        self.backoff.insert(key, Backoff { failures, next });
        next
    }

    async fn send(&self, intent: &Intent) -> Result<(), kube::Error> {
        let revisions: Api<NetworkConfigRevision> = Api::all(self.client.clone());
        let nncs: Api<NodeNetworkConfig> = Api::all(self.client.clone());
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        match intent {
            Intent::CreateRevision {
                name,
                spec,
                inputs,
                hold,
            } => {
                self.create_revision(name, spec, inputs, hold.as_ref())
                    .await
            }
            Intent::HoldRevision {
                hold: h,
                resource_version,
            } => hold_revision(&revisions, h, resource_version.as_deref()).await,
            Intent::RestoreRevisionSpec { name, hash, inputs } => {
                let patch = json!({ "spec": { "hash": hash } });
                let revision = revisions
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                put_inputs(&self.client, &revision, inputs).await
            }
            Intent::ReactivateRevision { name, status } => {
                let patch = json!({ "status": status });
                revisions
                    .patch_status(name, &merge_params(), &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
            Intent::ApplyNodeConfig {
                node,
                spec,
                assigned_at,
                clear_queued,
                pending,
                ..
            } => {
                let written = self
                    .apply_spec(node, spec, assigned_at.as_deref(), *clear_queued)
                    .await?;
                match pending {
                    Some(message) => mark_pending(&nncs, &written, message).await,
                    None => Ok(()),
                }
            }
            Intent::NodeRecord { node, record } => put_node_record(&nncs, node, record).await,
            Intent::NodeCondition { node, condition } => {
                put_node_condition(&nncs, node, condition.as_ref()).await
            }
            Intent::RevisionStatus { name, status } => {
                let patch = json!({
                    "apiVersion": "netwave.dev/v1alpha1",
                    "kind": "NetworkConfigRevision",
                    "status": &**status,
                });
                // Under an older CRD (a downgrade in flight) the fields it lacks are left out.
                netwave_runtime::apply::apply_status(&revisions, name, &apply, patch, &[])
                    .await
                    .map(drop)
            }
            Intent::InputStatus {
                kind, name, status, ..
            } => self.put_input_status(kind, name, status).await,
            Intent::DeleteRevision { name } => self.delete_revision(name).await,
            Intent::QueueNode {
                node,
                message,
                resource_version,
            } => queue_node(&self.client, node, message, resource_version.as_deref()).await,
            Intent::DeleteNodeConfig { name } => {
                match nncs.delete(name, &DeleteParams::default()).await {
                    Err(kube::Error::Api(ae)) if ae.code == 404 => Ok(()),
                    other => other.map(drop),
                }
            }
            Intent::Event {
                regarding,
                type_,
                reason,
                action,
                note,
            } => {
                debug!(%reason, object = ?regarding.name, "event");
                let event = Event {
                    type_: *type_,
                    reason: reason.clone(),
                    note: Some(note.chars().take(1000).collect()),
                    action: action.clone(),
                    secondary: None,
                };
                self.recorder.publish(&event, regarding).await
            }
        }
    }

    /// A revision (held as a destructive change when `hold` says so), then its inputs.
    async fn create_revision(
        &self,
        name: &str,
        spec: &NetworkConfigRevisionSpec,
        inputs: &RevisionInputs,
        hold: Option<&HoldRecord>,
    ) -> Result<(), kube::Error> {
        let revisions: Api<NetworkConfigRevision> = Api::all(self.client.clone());
        let mut ncr = NetworkConfigRevision::new(name, spec.clone());
        if let Some(h) = hold {
            ncr.meta_mut().annotations = Some(hold_annotations(h));
        }
        ncr.meta_mut().labels = Some(managed_by());
        let pp = create_params();
        let created = match revisions.create(&pp, &ncr).await {
            // Created by us earlier (the watch has not shown it yet, or before a crash) or by
            // the previous leader: the content is the same.
            Err(kube::Error::Api(ae)) if ae.code == 409 => revisions.get(name).await?,
            other => {
                let created = other?;
                // A hold says so in its Event.
                info!(revision = %name, sequence = spec.sequence, held = hold.is_some(), "created revision");
                created
            }
        };
        put_inputs(&self.client, &created, inputs).await
    }

    /// Server-side apply of an input object's whole status.
    async fn put_input_status(
        &self,
        kind: &InputKind,
        name: &str,
        status: &InputStatus,
    ) -> Result<(), kube::Error> {
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        let patch = json!({
            "apiVersion": "netwave.dev/v1alpha1",
            "kind": kind.as_str(),
            "status": status,
        });
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &kind.api_resource());
        netwave_runtime::apply::apply_status(&api, name, &apply, patch, &[])
            .await
            .map(drop)
    }

    /// A node's spec, applied under the assignment time the plan stamped (now, when it stamped
    /// none); the object as the API server wrote it.
    async fn apply_spec(
        &self,
        node: &str,
        spec: &NodeNetworkConfigSpec,
        assigned_at: Option<&str>,
        clear_queued: bool,
    ) -> Result<NodeNetworkConfig, kube::Error> {
        let sent_at = assigned_at
            .is_none()
            .then(|| crate::clock::now().to_rfc3339());
        let at = assigned_at.or(sent_at.as_deref());
        let mut annotations = BTreeMap::from([(ASSIGNED_AT_ANNOTATION, at.unwrap_or_default())]);
        if clear_queued {
            annotations.insert(QUEUED_ANNOTATION, "");
        }
        let patch = SpecApply {
            api_version: "netwave.dev/v1alpha1",
            kind: "NodeNetworkConfig",
            metadata: SpecApplyMeta {
                name: node,
                annotations,
            },
            spec,
        };
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        let req = nnc_request().patch(node, &apply, &Patch::Apply(&patch));
        let written: WrittenNodeConfig = send_read(&self.client, "patch", req).await?;
        Ok(written.into_node_config())
    }

    /// A revision and its inputs; either already gone is fine.
    async fn delete_revision(&self, name: &str) -> Result<(), kube::Error> {
        // The inputs go with it: by garbage collection where a controller manager runs (they
        // are owned by the revision), and here for where none does.
        let revisions: Api<NetworkConfigRevision> = Api::all(self.client.clone());
        let inputs: Api<NetworkConfigInputs> = Api::all(self.client.clone());
        for deleted in [
            revisions
                .delete(name, &DeleteParams::default())
                .await
                .map(drop),
            inputs
                .delete(name, &DeleteParams::default())
                .await
                .map(drop),
        ] {
            match deleted {
                Err(kube::Error::Api(ae)) if ae.code == 404 => {}
                other => other?,
            }
        }
        Ok(())
    }
}

/// Merge patches by the configurator, under its field manager.
fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// Holds a revision as a destructive change: paused, with the hold's annotations, over the version
/// the hold was measured on.
async fn hold_revision(
    revisions: &Api<NetworkConfigRevision>,
    h: &HoldRecord,
    resource_version: Option<&str>,
) -> Result<(), kube::Error> {
    let patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": hold_annotations(h),
        },
        "spec": { "paused": true },
    });
    revisions
        .patch(&h.revision, &merge_params(), &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// The configurator's conditions on a node config's status (none: removed); a node config gone is fine.
async fn put_node_condition(
    nncs: &Api<NodeNetworkConfig>,
    node: &str,
    condition: Option<&Condition>,
) -> Result<(), kube::Error> {
    let conditions: Vec<&Condition> = condition.into_iter().collect();
    let patch = json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "NodeNetworkConfig",
        "status": { "conditions": conditions },
    });
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    match nncs.patch_status(node, &apply, &Patch::Apply(&patch)).await {
        Err(kube::Error::Api(ae)) if ae.code == 404 => Ok(()),
        other => other.map(drop),
    }
}

/// Both annotations of a node's record on its NodeNetworkConfig, a missing one removed.
async fn put_node_record(
    nncs: &Api<NodeNetworkConfig>,
    node: &str,
    record: &NodeRecord,
) -> Result<(), kube::Error> {
    let annotations: serde_json::Map<String, serde_json::Value> = record
        .annotations()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.map_or(serde_json::Value::Null, Into::into)))
        .collect();
    let patch = json!({ "metadata": { "annotations": annotations } });
    nncs.patch(node, &merge_params(), &Patch::Merge(&patch))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_apply_is_the_object_an_admin_would_apply() {
        let spec = NodeNetworkConfigSpec {
            revision: "rev-1".into(),
            config_hash: "h1".into(),
            ..NodeNetworkConfigSpec::placeholder()
        };
        let patch = SpecApply {
            api_version: "netwave.dev/v1alpha1",
            kind: "NodeNetworkConfig",
            metadata: SpecApplyMeta {
                name: "node-1",
                annotations: BTreeMap::from([
                    (ASSIGNED_AT_ANNOTATION, "2026-11-26T00:00:00Z"),
                    (QUEUED_ANNOTATION, ""),
                ]),
            },
            spec: &spec,
        };
        let mut object = NodeNetworkConfig::new("node-1", spec.clone());
        object.metadata.annotations = Some(
            [
                (
                    ASSIGNED_AT_ANNOTATION.to_string(),
                    "2026-11-26T00:00:00Z".to_string(),
                ),
                (QUEUED_ANNOTATION.to_string(), String::new()),
            ]
            .into(),
        );
        assert_eq!(
            serde_json::to_value(&patch).expect("serializes"),
            serde_json::to_value(&object).expect("serializes"),
            "the typed patch is the object itself"
        );
    }

    /// An assignment reads of its apply's answer what `mark_pending` uses, and nothing it does not:
    /// the object the server returns (config, managed fields) decodes to the same decisions.
    #[test]
    fn an_applys_answer_is_read_for_what_mark_pending_uses() {
        let mut full = NodeNetworkConfig::new(
            "node-1",
            NodeNetworkConfigSpec {
                revision: "rev-2".into(),
                sequence: 2,
                config_hash: "h2".into(),
                retry: 1,
                config: serde_json::from_value(json!({
                    "vrfs": [{ "name": "blue", "device": "vr.blue", "table": 100, "mtu": 9000 }],
                }))
                .expect("a config"),
            },
        );
        full.metadata.resource_version = Some("42".into());
        full.metadata.managed_fields = Some(vec![Default::default()]);
        full.status = Some(netwave_api::NodeNetworkConfigStatus {
            phase: Some("Provisioned".into()),
            observed_revision: Some("rev-2".into()),
            config_hash: Some("h1".into()),
            ..Default::default()
        });
        let answer = serde_json::to_string(&full).expect("serializes");
        let read: WrittenNodeConfig = serde_json::from_str(&answer).expect("decodes");
        let read = read.into_node_config();
        let mut want = full.clone();
        want.spec.config = Default::default();
        want.metadata = kube::api::ObjectMeta {
            name: Some("node-1".into()),
            resource_version: Some("42".into()),
            ..Default::default()
        };
        assert_eq!(read, want);
        assert_eq!(
            read.status.as_ref().and_then(|st| st.stale_for(&read.spec)),
            Some(netwave_api::StaleReport::OlderConfig { reported: "h1" })
        );
    }

    #[test]
    fn every_error_category_is_one_the_metrics_start_with() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "X")
                    .with_code(code)
                    .boxed(),
            )
        };
        let errors = [
            api(409),
            api(429),
            api(404),
            api(422),
            api(503),
            api(400),
            kube::Error::LinesCodecMaxLineLengthExceeded,
        ];
        let seen: Vec<&str> = errors.iter().map(category).collect();
        assert_eq!(seen, crate::metrics::CATEGORIES);
    }
}
