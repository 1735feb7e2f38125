//! Reads from the API server, and the revision vocabulary every command shares: which revision a
//! name or number means, which one is the target, which one is the last good one.

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use netwave_api::vocab::RevisionPhase;
use netwave_api::{
    AnyInput, InputKind, NetworkConfigInputs, NetworkConfigRevision, NodeNetworkConfig,
    RevisionInputs,
};
use netwave_core::render::NodeInfo;
use netwave_core::revision::{ExistingRevision, canonical_inputs};

/// Field manager of every write the plugin makes (what `status` shows as "paused by").
pub const FIELD_MANAGER: &str = "kubectl-netwave";

/// Every revision, oldest (lowest sequence) first.
pub async fn revisions(client: &Client) -> anyhow::Result<Vec<NetworkConfigRevision>> {
    let mut list = Api::<NetworkConfigRevision>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context(
            "listing NetworkConfigRevisions (are netwave's CRDs installed, and may you list them?)",
        )?
        .items;
    sort_revisions(&mut list);
    Ok(list)
}

/// The inputs of the revision `name` (its `NetworkConfigInputs`).
pub async fn inputs_of(client: &Client, name: &str) -> anyhow::Result<RevisionInputs> {
    Api::<NetworkConfigInputs>::all(client.clone())
        .get(name)
        .await
        .map(|i| i.spec)
        .with_context(|| format!("reading the inputs of {name} (NetworkConfigInputs {name})"))
}

/// The inputs of every revision, by revision name.
pub async fn all_inputs(
    client: &Client,
) -> anyhow::Result<std::collections::BTreeMap<String, RevisionInputs>> {
    Ok(Api::<NetworkConfigInputs>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing NetworkConfigInputs (may you list them?)")?
        .items
        .into_iter()
        .map(|i| (i.name_any(), i.spec))
        .collect())
}

/// Oldest first; ties (which one writer never makes) by name.
pub fn sort_revisions(list: &mut [NetworkConfigRevision]) {
    list.sort_by(|a, b| {
        (
            netwave_api::effective_sequence(a),
            a.metadata.name.as_deref(),
        )
            .cmp(&(
                netwave_api::effective_sequence(b),
                b.metadata.name.as_deref(),
            ))
    });
}

pub async fn configs(client: &Client) -> anyhow::Result<Vec<NodeNetworkConfig>> {
    Ok(Api::<NodeNetworkConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing NodeNetworkConfigs")?
        .items)
}

pub async fn nodes(client: &Client) -> anyhow::Result<Vec<Node>> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing Nodes")?
        .items)
}

/// Nodes as render sees them (name and labels), sorted.
pub fn node_infos(nodes: &[Node]) -> Vec<NodeInfo> {
    let mut out: Vec<NodeInfo> = nodes
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .map(|n| NodeInfo {
            name: n.name_any(),
            labels: n.labels().clone(),
        })
        .collect();
    out.sort();
    out
}

/// The input objects on the cluster now, as the configurator folds them (objects being deleted are
/// already gone), canonically sorted.
pub async fn live_inputs(client: &Client) -> anyhow::Result<RevisionInputs> {
    let mut inputs = RevisionInputs::default();
    for kind in InputKind::ALL {
        let api = Api::<DynamicObject>::all_with(client.clone(), &kind.api_resource());
        let list =
            (api.list(&ListParams::default()).await).with_context(|| format!("listing {kind}s"))?;
        for o in list.items {
            if o.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = o.name_any();
            let value = serde_json::to_value(o).context("an object is JSON")?;
            let o = AnyInput::from_api(*kind, value)
                .with_context(|| format!("reading {kind}/{name}"))?;
            o.add_to(&mut inputs);
        }
    }
    // As the configurator folds them: cut for this build's render version.
    netwave_core::render::stamp_render_version(&mut inputs, netwave_core::render::RENDER_VERSION);
    Ok(canonical_inputs(&inputs))
}

pub fn name(r: &NetworkConfigRevision) -> &str {
    r.metadata.name.as_deref().unwrap_or_default()
}

pub fn phase(r: &NetworkConfigRevision) -> Option<RevisionPhase> {
    RevisionPhase::parse(r.status.as_ref().and_then(|s| s.phase.as_deref()))
}

/// The phase as written (`Pending` when the configurator has not written one yet).
pub fn phase_str(r: &NetworkConfigRevision) -> String {
    r.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| RevisionPhase::Pending.as_str().into())
}

/// Failed in its current attempt (core's rule: a bumped `spec.retry` re-arms it at once).
pub fn is_failed(r: &NetworkConfigRevision) -> bool {
    ExistingRevision::from_object(r).is_failed()
}

/// The target: the newest revision that has not failed (DESIGN §3).
pub fn target(revs: &[NetworkConfigRevision]) -> Option<&NetworkConfigRevision> {
    revs.iter().rev().find(|r| !is_failed(r))
}

/// The newest `Complete` revision with a sequence below `below` (all when `None`).
pub fn last_good(
    revs: &[NetworkConfigRevision],
    below: Option<u64>,
) -> Option<&NetworkConfigRevision> {
    revs.iter().rev().find(|r| {
        phase(r) == Some(RevisionPhase::Complete)
            && below.is_none_or(|s| netwave_api::effective_sequence(r) < s)
    })
}

/// The revision `arg` names: a name (`rev-3f9a0c12de`) or a sequence number (`7`).
pub fn resolve<'a>(
    revs: &'a [NetworkConfigRevision],
    arg: &str,
) -> anyhow::Result<&'a NetworkConfigRevision> {
    if let Some(r) = revs.iter().find(|r| name(r) == arg) {
        return Ok(r);
    }
    if let Ok(seq) = arg.parse::<u64>()
        && let Some(r) = revs
            .iter()
            .find(|r| netwave_api::effective_sequence(r) == seq)
    {
        return Ok(r);
    }
    if revs.is_empty() {
        bail!(
            "revision {arg} not found: there are no revisions yet (the configurator cuts one when \
             VRF, layer-2 or routing-table objects exist)"
        );
    }
    bail!("revision {arg} not found; `kubectl netwave history` lists them")
}

/// `arg`, or the current target when `None`.
pub fn resolve_or_target<'a>(
    revs: &'a [NetworkConfigRevision],
    arg: Option<&str>,
) -> anyhow::Result<&'a NetworkConfigRevision> {
    match arg {
        Some(a) => resolve(revs, a),
        None => match target(revs) {
            Some(t) => Ok(t),
            None if revs.is_empty() => bail!(
                "there are no revisions yet (the configurator cuts one when VRF, layer-2 or \
                 routing-table objects exist)"
            ),
            None => bail!(
                "every revision has failed, so there is no target; name one (`kubectl netwave \
                 history` lists them)"
            ),
        },
    }
}

/// Who paused the revision: `status.pausedBy` (the configurator records it from managedFields on its
/// next step), else the managedFields entry that owns `spec.paused` (core's reading of it).
pub fn paused_by(r: &NetworkConfigRevision) -> Option<String> {
    if !r.spec.paused {
        return None;
    }
    r.status
        .as_ref()
        .and_then(|s| s.paused_by.clone())
        .or_else(|| {
            netwave_core::rollout::RevisionState::from_api(r, Default::default())
                .ok()?
                .paused_by
        })
}

/// `5s`, `3m`, `2h`, `4d`, as kubectl prints ages.
pub fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Seconds from an API time to `now`.
pub fn secs_since(
    t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    now: netwave_core::Timestamp,
) -> i64 {
    (now.0 - t.0.as_millisecond()) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(5), "5s");
        assert_eq!(age(150), "2m");
        assert_eq!(age(3 * 3600), "3h");
        assert_eq!(age(5 * 86_400), "5d");
        assert_eq!(age(-3), "0s");
    }
}
