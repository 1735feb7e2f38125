//! Reads from the API server, and the revision vocabulary every command shares: which revision a
//! name or number means, which one is the target, which one is the last good one.

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use netwave_api::kinds::{Input, Visit};
use netwave_api::vocab::RevisionPhase;
use netwave_api::{
    AnyInput, InputKind, NetworkConfigInputs, NetworkConfigRevision, NodeNetworkConfig,
    RevisionInputs,
};
use netwave_core::render::NodeInfo;
use netwave_core::revision::{ExistingRevision, canonical_inputs};
use netwave_core::undecodable::{Kind, Undecodable};
use netwave_runtime::decoded::Decoded;
use std::sync::Arc;

/// Field manager of every write the plugin makes (what `status` shows as "paused by").
pub const FIELD_MANAGER: &str = "kubectl-netwave";

/// Objects of a kind as far as they decode as netwave's types, and those that do not (stored before a
/// schema bound existed, or under an older CRD). The configurator reads around such an object and says
/// so in an `Undecodable` Event on it; the views (`status`, `history`, `plan`) do the same and say what
/// it holds ([`unreadable_notes`]), so they work exactly when an admin needs them. Commands that write
/// refuse with [`Listed::strict`]: what they would write depends on what cannot be read.
#[derive(Debug)]
pub struct Listed<K> {
    pub items: Vec<K>,
    pub unreadable: Vec<Undecodable>,
}

impl<K> Listed<K> {
    /// The objects, or an error naming every object that cannot be read.
    pub fn strict(self) -> anyhow::Result<Vec<K>> {
        refuse_unreadable(&self.unreadable)?;
        Ok(self.items)
    }
}

/// An error naming every object in `unreadable`, if there is one: a command that writes stops there.
fn refuse_unreadable(unreadable: &[Undecodable]) -> anyhow::Result<()> {
    if unreadable.is_empty() {
        return Ok(());
    }
    bail!(
        "{}; fix or delete {} first (`kubectl netwave status` shows what the configurator holds \
         meanwhile)",
        unreadable
            .iter()
            .map(|u| format!("{} {} cannot be decoded ({})", u.kind, u.name, u.error))
            .collect::<Vec<_>>()
            .join("; "),
        if unreadable.len() == 1 { "it" } else { "them" }
    )
}

/// How far a revision's rollout got while it was the target (`status.reached`), else, for one a
/// configurator before 0.2.0 left, its live counts.
pub fn reached(r: &NetworkConfigRevision) -> Option<netwave_api::Reached> {
    let st = r.status.as_ref()?;
    Some(st.reached.clone().unwrap_or(netwave_api::Reached {
        updated: st.updated,
        total: st.total,
    }))
}

/// What is known of `d` when it does not decode as `K`.
pub fn unreadable<K>(kind: Kind, d: &Decoded<K>) -> Option<Undecodable> {
    d.undecodable().map(|u| Undecodable {
        kind,
        name: u.metadata.name.clone().unwrap_or_default(),
        error: u.error.clone(),
    })
}

/// The objects among `all` that decode (cloned), and what is known of those that do not.
pub fn split<'a, K: Clone + 'a>(
    kind: Kind,
    all: impl Iterator<Item = &'a Arc<Decoded<K>>>,
) -> (Vec<K>, Vec<Undecodable>) {
    let mut out = (Vec::new(), Vec::new());
    for d in all {
        match unreadable(kind, d) {
            Some(u) => out.1.push(u),
            None => out.0.extend(d.object().map(|k| (**k).clone())),
        }
    }
    out
}

/// Every object of `K`, each decoded on its own (one that does not decode fails only itself).
async fn list<K>(client: &Client, kind: Kind, context: &'static str) -> anyhow::Result<Listed<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = Api::<Decoded<K>>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context(context)?;
    let mut out = Listed {
        items: Vec::new(),
        unreadable: Vec::new(),
    };
    for d in list.items {
        match unreadable(kind, &d) {
            Some(u) => out.unreadable.push(u),
            None => out.items.extend(d.object().map(|k| (**k).clone())),
        }
    }
    Ok(out)
}

/// Every revision that decodes, oldest (lowest sequence) first, and those that do not.
pub async fn read_revisions(client: &Client) -> anyhow::Result<Listed<NetworkConfigRevision>> {
    let mut l = list(
        client,
        Kind::Revision,
        "listing NetworkConfigRevisions (are netwave's CRDs installed, and may you list them?)",
    )
    .await?;
    sort_revisions(&mut l.items);
    Ok(l)
}

/// Every revision, oldest (lowest sequence) first; an error naming any that cannot be decoded.
pub async fn revisions(client: &Client) -> anyhow::Result<Vec<NetworkConfigRevision>> {
    read_revisions(client).await?.strict()
}

/// The inputs of the revision `name` (its `NetworkConfigInputs`).
pub async fn inputs_of(client: &Client, name: &str) -> anyhow::Result<RevisionInputs> {
    Api::<NetworkConfigInputs>::all(client.clone())
        .get(name)
        .await
        .map(|i| i.spec)
        .with_context(|| format!("reading the inputs of {name} (NetworkConfigInputs {name})"))
}

/// The inputs of every revision that decode, by revision name, and those that do not.
pub async fn read_all_inputs(client: &Client) -> anyhow::Result<Listed<(String, RevisionInputs)>> {
    let l = list::<NetworkConfigInputs>(
        client,
        Kind::RevisionInputs,
        "listing NetworkConfigInputs (may you list them?)",
    )
    .await?;
    Ok(Listed {
        items: l
            .items
            .into_iter()
            .map(|i| (i.name_any(), i.spec))
            .collect(),
        unreadable: l.unreadable,
    })
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

/// Every node config that decodes, and those that do not.
pub async fn read_configs(client: &Client) -> anyhow::Result<Listed<NodeNetworkConfig>> {
    list(client, Kind::NodeConfig, "listing NodeNetworkConfigs").await
}

/// Every node config; an error naming any that cannot be decoded.
pub async fn configs(client: &Client) -> anyhow::Result<Vec<NodeNetworkConfig>> {
    read_configs(client).await?.strict()
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
/// already gone), canonically sorted; and those that cannot be decoded (while one exists the
/// configurator cuts no revision).
pub async fn read_live_inputs(
    client: &Client,
) -> anyhow::Result<(RevisionInputs, Vec<Undecodable>)> {
    let mut inputs = RevisionInputs::default();
    let mut unreadable = Vec::new();
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
            match AnyInput::from_api(*kind, value.clone()) {
                Ok(o) => o.add_to(&mut inputs),
                Err(_) => unreadable.push(Undecodable {
                    kind: Kind::Input(*kind),
                    name,
                    error: input_decode_error(*kind, &value),
                }),
            }
        }
    }
    // As the configurator folds them: cut for this build's render version.
    netwave_core::render::stamp_render_version(&mut inputs, netwave_core::render::RENDER_VERSION);
    Ok((canonical_inputs(&inputs), unreadable))
}

/// Why `value` does not decode as an object of `kind`, with the field path (as the configurator's
/// Event says it).
fn input_decode_error(kind: InputKind, value: &serde_json::Value) -> String {
    struct PathOf<'a>(&'a str, String);
    impl Visit for PathOf<'_> {
        fn visit<K: Input>(&mut self) {
            self.1 = netwave_runtime::decoded::decode_error::<K>(self.0);
        }
    }
    let json = value.to_string();
    let mut p = PathOf(&json, String::new());
    kind.visit(&mut p);
    p.1
}

/// The input objects on the cluster now (see [`read_live_inputs`]); an error naming any that cannot
/// be decoded.
pub async fn live_inputs(client: &Client) -> anyhow::Result<RevisionInputs> {
    let (inputs, unreadable) = read_live_inputs(client).await?;
    refuse_unreadable(&unreadable)?;
    Ok(inputs)
}

/// One line per object that cannot be read: what does not decode and what the configurator holds
/// meanwhile (the words of its `Undecodable` Event).
pub fn unreadable_notes(objects: &[Undecodable]) -> Vec<String> {
    let mut sorted = objects.to_vec();
    sorted.sort();
    sorted.iter().map(netwave_core::undecodable::note).collect()
}

/// The text block of [`unreadable_notes`] (empty when there are none).
pub fn render_unreadable(notes: &[String]) -> String {
    if notes.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "cannot read {} object(s); left out here as the configurator leaves them out:\n",
        notes.len()
    );
    for n in notes {
        s.push_str(&format!("  {n}\n"));
    }
    s
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
