//! Simulated agents: answer every NodeNetworkConfig the way a real agent reports, without a kernel. One
//! implementation for the configurator's tests, the rootless e2e fleet and demo, and benchmarks, so
//! none of them drifts from the real agent's report: the status is built by the agent's own
//! [`status::from_outcome`] and written the way the agent writes it (server-side apply of the status
//! subresource, field manager `netwave-agent`).
//!
//! ```text
//!  watch NNCs ──► new (revision, retry, configHash) not yet reported ──► behaviour(nnc)
//!      ──► status apply `Provisioning` ──(after delay)──► status apply Provisioned | Invalid
//!      (Silent: nothing, as a dead agent)
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use netwave_api::{NodeNetworkConfig, NodeNetworkConfigStatus};
use netwave_runtime::decoded::Decoded;
use serde_json::json;
use tokio::task::{AbortHandle, JoinSet};

use crate::reconcile::{Outcome, Reason, Target};
use crate::shell::FIELD_MANAGER;
use crate::shell::report::ATTEMPT_TIMEOUT;
use crate::shell::status;

/// How a simulated agent answers one spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Applied and healthy: the node runs the spec's config.
    Provisioned,
    /// Refused or rolled back: the node keeps running its last good config.
    Invalid { reason: Reason, message: String },
    /// Never reports (a dead or hung agent).
    Silent,
}

/// Decides the answer for a spec (the node is `nnc.name_any()`).
pub type Behaviour = Arc<dyn Fn(&NodeNetworkConfig) -> Answer + Send + Sync>;

/// How long the agent takes to answer a spec (the apply), by spec.
pub type Pace = Arc<dyn Fn(&NodeNetworkConfig) -> Duration + Send + Sync>;

/// Every node's agent answers `Provisioned`.
pub fn always_ok() -> Behaviour {
    Arc::new(|_| Answer::Provisioned)
}

/// The status a real agent reports for `answer` to `nnc`'s spec; `None` for [`Answer::Silent`].
pub fn status_for(nnc: &NodeNetworkConfig, answer: &Answer) -> Option<serde_json::Value> {
    let prev = nnc.status.clone().unwrap_or_default();
    let (revision, retry) = (&nnc.spec.revision, nnc.spec.retry);
    let o = match answer {
        Answer::Silent => return None,
        Answer::Provisioned => Outcome::provisioned(
            revision,
            retry,
            &nnc.spec.config_hash,
            "applied (simulated agent, no kernel)".into(),
        ),
        // A real agent rolls a failed apply back to what ran before.
        Answer::Invalid { reason, message } => Outcome::invalid(
            revision,
            retry,
            *reason,
            message.clone(),
            (prev.config_hash.clone(), prev.last_good_revision.clone()),
        )
        .rolled_back(),
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let st = status::answering(
        status::from_outcome(&o, Some(&prev), &Default::default(), now.clone()),
        nnc,
        &now,
    );
    Some(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "NodeNetworkConfig",
        "status": st,
    }))
}

/// The `Provisioning` status a real agent writes when it picks `nnc`'s spec up to apply it (the
/// configurator counts the apply timeout from its `lastTransitionTime`: `core::rollout::deadline`), by
/// the agent's own [`status::provisioning`]; `None` for [`Answer::Silent`] (a dead agent never starts).
pub fn provisioning_for(
    nnc: &NodeNetworkConfig,
    answer: &Answer,
) -> Option<NodeNetworkConfigStatus> {
    if *answer == Answer::Silent {
        return None;
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let target = Target::from(&nnc.spec);
    let st = status::provisioning(
        &target,
        nnc.status.as_ref(),
        &Default::default(),
        now.clone(),
    );
    Some(status::judged(st, nnc, &now))
}

/// The answer a real agent writes once the apply it reported `Provisioning` for (`provisioning`, from
/// [`provisioning_for`]) ends: as [`status_for`], but following that report as the agent's does (its
/// `lastTransitionTime` is the answer's, not carried over from the previous revision's answer).
pub fn answer_after(
    nnc: &NodeNetworkConfig,
    provisioning: &NodeNetworkConfigStatus,
    answer: &Answer,
) -> Option<serde_json::Value> {
    let mut after = nnc.clone();
    after.status = Some(provisioning.clone());
    status_for(&after, answer)
}

/// The body of the agent's server-side apply of `st` to the status subresource.
pub fn status_apply(st: &NodeNetworkConfigStatus) -> serde_json::Value {
    json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "NodeNetworkConfig",
        "status": st,
    })
}

/// Writes `body` to `name`'s status as the agent does (server-side apply, field manager
/// `netwave-agent`, forced; under an older CRD without the fields it does not declare; each attempt
/// given up after the agent's [`ATTEMPT_TIMEOUT`], so a request stuck across an API server restart
/// is sent again), retrying failures up to `tries` times 100 ms apart: the stored object, or `None`
/// when it is gone or every try failed.
pub async fn write_status(
    api: &Api<NodeNetworkConfig>,
    name: &str,
    body: &serde_json::Value,
    tries: usize,
) -> Option<NodeNetworkConfig> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for _ in 0..tries {
        let attempt = netwave_runtime::apply::apply_status(
            api,
            name,
            &params,
            body.clone(),
            &netwave_api::NNC_STATUS_TOGETHER,
        );
        match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await {
            Ok(Ok((o, _))) => return Some(o),
            Ok(Err(kube::Error::Api(ae))) if ae.code == 404 => return None,
            Ok(Err(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    None
}

/// Reports on `nnc`'s spec as a real agent does: `Provisioning` at once (when the agent picks it up),
/// then `answer` after `delay` (the apply). Returns what the server answered each write with (for
/// benchmarks that count it).
pub async fn report(
    api: &Api<NodeNetworkConfig>,
    nnc: &NodeNetworkConfig,
    answer: &Answer,
    delay: Duration,
    tries: usize,
) -> Vec<NodeNetworkConfig> {
    let Some(provisioning) = provisioning_for(nnc, answer) else {
        return Vec::new();
    };
    let name = nnc.name_any();
    let mut written = Vec::new();
    match write_status(api, &name, &status_apply(&provisioning), tries).await {
        Some(o) => written.push(o),
        None => return written,
    }
    tokio::time::sleep(delay).await;
    if let Some(body) = answer_after(nnc, &provisioning, answer)
        && let Some(o) = write_status(api, &name, &body, tries).await
    {
        written.push(o);
    }
    written
}

/// One spec a node was answered for: (revision, retry, configHash).
pub type SpecKey = (String, u32, String);

/// What an agent judges `nnc`'s spec by: a new key is a new spec to answer.
pub fn spec_key(nnc: &NodeNetworkConfig) -> SpecKey {
    (
        nnc.spec.revision.clone(),
        nnc.spec.retry,
        nnc.spec.config_hash.clone(),
    )
}

/// Whether the status already answers this spec, as the real agent judges it ([`crate::reconcile::decide`]):
/// `Invalid` for this revision and retry, or `Provisioned` for them *and* this config (a config re-rendered
/// under the same revision is answered again).
fn already_reported(nnc: &NodeNetworkConfig) -> bool {
    let st = nnc.status.clone().unwrap_or_default();
    let same_attempt = st.observed_revision.as_deref() == Some(nnc.spec.revision.as_str())
        && st.observed_retry.unwrap_or(0) == nnc.spec.retry;
    let same_config = st
        .observed_config_hash
        .as_deref()
        .is_none_or(|h| h == nnc.spec.config_hash);
    same_attempt
        && match st.phase.as_deref() {
            Some(crate::reconcile::INVALID) => same_config,
            Some(crate::reconcile::PROVISIONED) => {
                st.config_hash.as_deref() == Some(nnc.spec.config_hash.as_str())
            }
            _ => false,
        }
}

/// Simulated agents for every node, until the returned task is aborted (which also aborts every answer
/// on its way). Each new (revision, retry, configHash) of a node is answered once, as a real agent
/// answers it ([`report`]): `Provisioning` when it is seen, the answer `delay` later. Write errors are
/// retried like a real agent's (an API server restart is outlasted), never turned into a verdict.
pub fn spawn(client: Client, behaviour: Behaviour, delay: Duration) -> tokio::task::JoinHandle<()> {
    spawn_watching(client, None, behaviour, Arc::new(move |_| delay))
}

/// The simulated agent of one node, as its real agent runs: it watches only that node's config (a
/// field selector on its name), so it works with the agent's own credentials (a token bound to a pod on
/// that node, which the admission policy lets write that node's status only).
pub fn spawn_node(
    client: Client,
    node: &str,
    behaviour: Behaviour,
    delay: Duration,
) -> tokio::task::JoinHandle<()> {
    spawn_node_paced(client, node, behaviour, Arc::new(move |_| delay))
}

/// As [`spawn_node`], answering each spec after `pace` of it (a test that needs one rollout slow).
pub fn spawn_node_paced(
    client: Client,
    node: &str,
    behaviour: Behaviour,
    pace: Pace,
) -> tokio::task::JoinHandle<()> {
    spawn_watching(client, Some(node.to_string()), behaviour, pace)
}

fn spawn_watching(
    client: Client,
    node: Option<String>,
    behaviour: Behaviour,
    pace: Pace,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<NodeNetworkConfig> = Api::all(client.clone());
        let handled: Arc<Mutex<BTreeMap<String, SpecKey>>> = Arc::default();
        // Like the real agent, one node config that does not decode leaves the others answered.
        let decoded: Api<Decoded<NodeNetworkConfig>> = Api::all(client);
        let config = match &node {
            Some(n) => watcher::Config::default().fields(&format!("metadata.name={n}")),
            None => watcher::Config::default(),
        };
        let stream = watcher(decoded, config).default_backoff();
        futures::pin_mut!(stream);
        let mut answers = JoinSet::new();
        // Each node's answer in flight: a newer spec supersedes it, as the real agent's newest status
        // replaces one not yet written (two writers of one node's status would race: an older answer
        // retried across an API outage could land over the newer one).
        let mut in_flight: BTreeMap<String, AbortHandle> = BTreeMap::new();
        while let Some(ev) = stream.next().await {
            while answers.try_join_next().is_some() {}
            let nnc = match ev {
                Ok(watcher::Event::Apply(Decoded::Object(o)))
                | Ok(watcher::Event::InitApply(Decoded::Object(o))) => Arc::unwrap_or_clone(o),
                _ => continue,
            };
            // A placeholder: nothing assigned, nothing to answer (as the real agent).
            if nnc.spec.is_placeholder() {
                continue;
            }
            let name = nnc.name_any();
            let key = spec_key(&nnc);
            let reported = already_reported(&nnc);
            if reported || handled.lock().unwrap().get(&name) == Some(&key) {
                continue;
            }
            handled.lock().unwrap().insert(name.clone(), key);
            let answer = behaviour(&nnc);
            let delay = pace(&nnc);
            let api = api.clone();
            // A minute of tries: an API server restart is outlasted.
            let task =
                answers.spawn(async move { drop(report(&api, &nnc, &answer, delay, 600).await) });
            if let Some(older) = in_flight.insert(name, task) {
                older.abort();
            }
        }
    })
}
