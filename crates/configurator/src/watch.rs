//! Reflectors on every kind the configurator reads. Each one keeps an in-memory store current and pokes
//! the reconcile loop when anything changed.
//!
//! Every replica watches the inputs, revisions and Nodes from its start, so a standby has them the
//! moment it takes over. The NodeNetworkConfigs are watched only once a takeover is near or done
//! ([`LeaderWatch`]): every agent report is an event on them, most of a rollout's events, and a standby
//! decoding them all for a takeover that rarely comes spent about half a leader's CPU (#28). A standby
//! lists them once the leader's Lease goes unrenewed past a leader's renew deadline (so the list is in
//! when it runs out), a replica that takes a free Lease when it does; nothing is planned before it.
//!
//! netwave's kinds are watched as [`Decoded`]: an object that does not decode (stored before a schema
//! bound existed, or under an older CRD) is kept with its name and the error instead of failing the
//! whole list, so one bad object never blinds the configurator; the reconcile reports and skips it
//! (`netwave_core::undecodable`). Nodes are the API server's own kind, validated by it against the
//! types k8s-openapi is generated from, and are watched as they are.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use netwave_api::kinds::{ByKind, Family, Input, Make, Visit, each_kind};
use netwave_api::{NetworkConfigInputs, NetworkConfigRevision, NodeNetworkConfig};
use netwave_runtime::decoded::Decoded;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{Instrument, info, info_span, warn};

use crate::liveness::{Liveness, WatchHealth};
use crate::wire::WireNodeConfig;

/// Read-only views of the cluster, kept current by the reflectors.
#[derive(Clone)]
pub struct Stores {
    /// The admin inputs, one store per kind.
    pub inputs: ByKind<InputStores>,
    pub nodes: Store<Node>,
    /// Empty, and not ready, until [`Stores::node_configs_watch`] started and listed.
    pub node_configs: Store<Decoded<NodeNetworkConfig>>,
    pub node_configs_watch: LeaderWatch,
    pub revisions: Store<Decoded<NetworkConfigRevision>>,
    /// The revisions' inputs, one object per revision under its name.
    pub revision_inputs: Store<Decoded<NetworkConfigInputs>>,
    /// The names of the nodes and node configs that changed since a reconcile last took them: a
    /// reconcile reads those of the fleet's objects again, not the whole fleet (#28).
    pub node_changes: Journal,
    pub config_changes: Journal,
}

/// [`ByKind`] family: each input kind's store.
pub struct InputStores;
impl Family for InputStores {
    type Of<K: Input> = Store<Decoded<K>>;
}

/// Names of the objects of one kind that changed, written by its watch after the store has the change
/// and before the reconcile loop is poked; taken by the reconcile.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<Changes>>);

/// What a [`Journal`] collected since it was last taken.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    pub names: BTreeSet<String>,
    /// The watch listed the kind again (its first list, or after it lost its place): the store was
    /// replaced, and every object may have changed.
    pub relisted: bool,
}

impl Journal {
    fn lock(&self) -> std::sync::MutexGuard<'_, Changes> {
        // The lock guards a set: a panic elsewhere cannot leave it half-written.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes one watch event.
    pub(crate) fn note<K: Resource>(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                if let Some(name) = o.meta().name.clone() {
                    self.lock().names.insert(name);
                }
            }
            watcher::Event::InitDone => {
                let mut c = self.lock();
                c.relisted = true;
                c.names.clear();
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    /// What changed since the last call.
    pub fn take(&self) -> Changes {
        std::mem::take(&mut *self.lock())
    }
}

/// A watch only a leader keeps: started the first time the replica leads, or sees the leader falter
/// (its Lease unrenewed past the renew deadline: the list is in when the Lease runs out), then kept
/// (a replica that lost the Lease for a moment does not list the fleet again when it gets it back).
#[derive(Clone)]
pub struct LeaderWatch(Arc<Mutex<Option<Start>>>);

/// What starts a [`LeaderWatch`].
type Start = Box<dyn FnOnce() + Send>;

impl LeaderWatch {
    fn new(start: impl FnOnce() + Send + 'static) -> Self {
        Self(Arc::new(Mutex::new(Some(Box::new(start)))))
    }

    /// One whose store is fed by other means (tests).
    pub fn started() -> Self {
        Self(Arc::new(Mutex::new(None)))
    }

    /// Starts the watch, unless it runs already; whether it started now.
    pub fn start(&self) -> bool {
        let start = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        start.map(|start| start()).is_some()
    }
}

impl Stores {
    /// Whether the node configs' watch has listed: before that, nothing can be planned.
    pub fn node_configs_ready(&self) -> bool {
        use futures::FutureExt;
        (self.node_configs.wait_until_ready().now_or_never()).is_some_and(|r| r.is_ok())
    }

    /// Resolves once every reflector a standby keeps has delivered its initial list (not the node
    /// configs', which starts when the replica leads).
    pub async fn wait_until_ready(&self) -> bool {
        type Ready = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;
        struct Inputs<'a>(&'a ByKind<InputStores>, Vec<Ready>);
        impl Visit for Inputs<'_> {
            fn visit<K: Input>(&mut self) {
                let store = self.0.get::<K>().clone();
                self.1.push(Box::pin(
                    async move { store.wait_until_ready().await.is_ok() },
                ));
            }
        }
        let mut inputs = Inputs(&self.inputs, Vec::new());
        each_kind(&mut inputs);
        let inputs_ready = futures::future::join_all(inputs.1).await;
        inputs_ready.into_iter().all(|ready| ready)
            && self.nodes.wait_until_ready().await.is_ok()
            && self.revisions.wait_until_ready().await.is_ok()
            && self.revision_inputs.wait_until_ready().await.is_ok()
    }
}

/// What the watches tell the reconcile loop: that something changed, and since when changes have
/// been waiting for a reconcile. The loop's coalesce window counts from the first change it has not
/// taken yet, not from when the loop got to it: a report that came in while a reconcile was writing
/// has waited already, and waiting the whole window again after the writes added that much to its
/// reaction (#28).
#[derive(Default)]
pub struct Wakeups {
    notify: Notify,
    first: Mutex<Option<Instant>>,
}

impl Wakeups {
    /// A change: noted (the first since the last [`Wakeups::take`] with its time), and the loop
    /// woken.
    pub fn mark(&self) {
        self.first
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(Instant::now);
        self.notify.notify_one();
    }

    /// Waits for a change; returns when the first change not taken yet came (now, for a wake-up
    /// without one, such as a leadership change).
    pub async fn wait(&self) -> Instant {
        self.notify.notified().await;
        self.first
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unwrap_or_else(Instant::now)
    }

    /// Wakes the loop without a change to count from.
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// The changes so far are being taken (a reconcile reads the stores next): later ones count
    /// afresh.
    pub fn take(&self) {
        *self.first.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Starts one reflector per kind, but the node configs' ([`LeaderWatch`]); `changed` is notified on
/// every event, and each watch reports its lists and errors to `live` (a replica that cannot list
/// cannot lead).
pub fn start(client: &Client, changed: Arc<Wakeups>, live: &Liveness) -> Stores {
    let (node_changes, config_changes) = (Journal::default(), Journal::default());
    let (node_configs, node_configs_watch) =
        reflect_node_configs(client, changed.clone(), live, config_changes.clone());
    Stores {
        inputs: ByKind::make(&mut WatchInputs {
            client,
            changed: &changed,
            live,
        }),
        nodes: reflect_with(
            Api::all(client.clone()),
            changed.clone(),
            live,
            Some(node_changes.clone()),
            slim_node,
        ),
        node_configs,
        node_configs_watch,
        revisions: reflect_decoded(client, changed.clone(), live, None, |_| {}),
        revision_inputs: reflect_decoded(
            client,
            changed,
            live,
            None,
            |i: &mut NetworkConfigInputs| i.metadata.managed_fields = None,
        ),
        node_changes,
        config_changes,
    }
}

/// Starts one reflector per input kind.
struct WatchInputs<'a> {
    client: &'a Client,
    changed: &'a Arc<Wakeups>,
    live: &'a Liveness,
}

impl Make<InputStores> for WatchInputs<'_> {
    fn make<K: Input>(&mut self) -> Store<Decoded<K>> {
        reflect_decoded(self.client, self.changed.clone(), self.live, None, |_| {})
    }
}

/// Keeps only what the rollout reads of a Node (labels, unschedulable, conditions): on a large cluster
/// image lists and managed fields would dominate the cache.
fn slim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
    }
}

/// Marks a cached NodeNetworkConfig whose `spec.config` was dropped because it hashes to
/// `spec.configHash` (set in this process's cache only, never written to the API). The integrity check
/// skips configs carrying it, so it must never come from outside: [`slim_node_config`] removes it from
/// every object the watch delivers before deciding whether to set it (anyone who can write a spec can
/// write an annotation of this name too, and would otherwise switch the check off for their edit).
pub const CONFIG_VERIFIED: &str = "netwave.dev/cached-config-verified";

/// What a cached NodeNetworkConfig's dropped `spec.config` runs, item by item
/// (`netwave_core::rollout::loss::config_items`, one per line), for the hold on moves
/// ([`crate::moves`]). Like [`CONFIG_VERIFIED`] it is set in this process's cache only and removed
/// from every object the watch delivers.
pub const CONFIG_ITEMS: &str = "netwave.dev/cached-config-items";

/// The node config specs found to hash to their `configHash`, by name: the spec's uid, generation and
/// hash. The API server bumps `metadata.generation` on every change of a spec (and only there; no
/// client can set it), so an event with the same uid and generation carries the same spec: the status
/// writes that are most of a rollout's events are not hashed again (#28: hashing was 2 % of the
/// leader's CPU, more of the standby's).
/// With each, the items its config runs ([`CONFIG_ITEMS`]): a known spec's config is not decoded.
#[derive(Default)]
struct Verified(std::collections::HashMap<String, (String, i64, String, Arc<str>)>);

/// More names than any fleet has nodes: the memory of deleted configs is dropped then.
const VERIFIED_MAX: usize = 100_000;

impl Verified {
    /// Whether the spec of the object with metadata `m` and config hash `hash` was found good.
    fn knows(&self, m: &ObjectMeta, hash: &str) -> bool {
        self.noted(m, hash).is_some()
    }

    /// The items of the config of a spec found good ([`Verified::knows`]).
    fn noted(&self, m: &ObjectMeta, hash: &str) -> Option<Arc<str>> {
        let (name, uid, generation) = (m.name.as_ref()?, m.uid.as_ref()?, m.generation?);
        let (u, g, h, items) = self.0.get(name)?;
        (u == uid && *g == generation && h == hash).then(|| items.clone())
    }

    fn remember(&mut self, nnc: &NodeNetworkConfig, ok: bool, items: Arc<str>) {
        let m = &nnc.metadata;
        let Some(name) = m.name.as_ref() else {
            return;
        };
        match (ok, m.uid.as_ref(), m.generation) {
            (true, Some(uid), Some(generation)) => {
                if self.0.len() >= VERIFIED_MAX {
                    self.0.clear();
                }
                let hash = nnc.spec.config_hash.clone();
                self.0
                    .insert(name.clone(), (uid.clone(), generation, hash, items));
            }
            _ => drop(self.0.remove(name)),
        }
    }
}

/// Keeps of a NodeNetworkConfig what the configurator reads: its spec's revision, hash, retry, the
/// assignment time and the agent's report. The config itself (about 4 KB of JSON per node with the
/// samples, several times that in memory) is only needed to check that it still hashes to its
/// `configHash` (tamper detection, [`crate::integrity`]): that is checked here (once per version of
/// the spec, [`Verified`]), and a config that passes is dropped and marked [`CONFIG_VERIFIED`]; one
/// that fails stays for the integrity check. At 5,000 nodes this is most of the cache (#14).
fn slim_node_config(nnc: &mut NodeNetworkConfig, verified: &mut Verified) {
    nnc.metadata.managed_fields = None;
    if let Some(a) = nnc.metadata.annotations.as_mut() {
        a.remove(CONFIG_VERIFIED);
        a.remove(CONFIG_ITEMS);
    }
    if nnc.spec.is_placeholder() {
        return;
    }
    let (ok, items) = match verified.noted(&nnc.metadata, &nnc.spec.config_hash) {
        Some(items) => (true, items),
        None => {
            let ok = netwave_core::render::config_hash(&nnc.spec.config) == nnc.spec.config_hash;
            let items = netwave_core::rollout::loss::config_items(&nnc.spec.config);
            (
                ok,
                Arc::from(items.into_iter().collect::<Vec<_>>().join("\n")),
            )
        }
    };
    verified.remember(nnc, ok, items.clone());
    if ok {
        nnc.spec.config = Default::default();
        let a = nnc
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        a.insert(CONFIG_VERIFIED.to_string(), "true".to_string());
        a.insert(CONFIG_ITEMS.to_string(), items.to_string());
    }
}

/// [`slim_node_config`] for a node config read outside the watch (`crate::recheck`): its config is
/// hashed, as for a spec the watch has not seen.
pub fn slim_fresh_node_config(nnc: &mut NodeNetworkConfig) {
    slim_node_config(nnc, &mut Verified::default());
}

/// The node configs' reflector. Node configs are read as [`WireNodeConfig`]: their managed fields
/// are skipped, and their `spec.config` is decoded only for a spec the watch has not verified yet (a
/// status write, most of a rollout's events, carries a spec already verified). Then as
/// [`slim_node_config`]. Only a leader keeps it: the store stays empty until the returned
/// [`LeaderWatch`] is started.
fn reflect_node_configs(
    client: &Client,
    changed: Arc<Wakeups>,
    live: &Liveness,
    journal: Journal,
) -> (Store<Decoded<NodeNetworkConfig>>, LeaderWatch) {
    let (reader, writer) = reflector::store();
    let (client, live) = (client.clone(), live.clone());
    let start = move || {
        let mut verified = Verified::default();
        let stream = watcher(
            Api::<Decoded<WireNodeConfig>>::all(client),
            netwave_runtime::watch_config(),
        )
        .default_backoff()
        .map_ok(move |event| map_event(event, &mut |w| cache_node_config(w, &mut verified)))
        .inspect_ok(first_list_told(Instant::now()));
        let kind = NodeNetworkConfig::kind(&()).to_string();
        let health = live.leader_watch(&kind);
        spawn_reflector(stream, writer, changed, health, Some(journal), kind);
    };
    (reader, LeaderWatch::new(start))
}

/// Tells, in one line, how many node configs the first list brought and how long it took (what a
/// takeover waits for before it plans, unless it came before).
fn first_list_told<K>(started: Instant) -> impl FnMut(&watcher::Event<K>) {
    let (mut listed, mut told) = (0usize, false);
    move |event| match event {
        watcher::Event::InitApply(_) if !told => listed += 1,
        watcher::Event::InitDone if !told => {
            told = true;
            info!(
                listed,
                ms = started.elapsed().as_millis() as u64,
                "node configs listed: a leader plans on them"
            );
        }
        _ => {}
    }
}

/// What the cache keeps of a node config off the wire: its `spec.config` is decoded only when
/// `verified` does not know the spec, then [`slim_node_config`].
fn cache_node_config(
    wire: Decoded<WireNodeConfig>,
    verified: &mut Verified,
) -> Decoded<NodeNetworkConfig> {
    let wire = match wire {
        Decoded::Object(w) => Arc::unwrap_or_clone(w),
        Decoded::Undecodable(mut u) => {
            Arc::make_mut(&mut u).metadata.managed_fields = None;
            return Decoded::Undecodable(u);
        }
    };
    let known = !wire.is_placeholder() && verified.knows(wire.metadata(), wire.config_hash());
    let mut cached = wire.into_typed(known);
    // Just built: nothing else holds it, nothing is copied.
    cached.modify(|nnc| slim_node_config(nnc, verified));
    cached
}

/// One watch event with its object converted by `f`.
fn map_event<A, B>(event: watcher::Event<A>, f: &mut impl FnMut(A) -> B) -> watcher::Event<B> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// A reflector on one of netwave's kinds, tolerant of objects that do not decode; `slim` applies to the
/// ones that do.
fn reflect_decoded<K>(
    client: &Client,
    changed: Arc<Wakeups>,
    live: &Liveness,
    journal: Option<Journal>,
    mut slim: impl FnMut(&mut K) + Send + 'static,
) -> Store<Decoded<K>>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    reflect_with(
        Api::all(client.clone()),
        changed,
        live,
        journal,
        move |d: &mut Decoded<K>| d.modify(&mut slim),
    )
}

fn reflect_with<K>(
    api: Api<K>,
    changed: Arc<Wakeups>,
    live: &Liveness,
    journal: Option<Journal>,
    slim: impl FnMut(&mut K) + Send + 'static,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let stream = watcher(api, netwave_runtime::watch_config())
        .default_backoff()
        .modify(slim);
    reflect_stream(stream, changed, live, journal)
}

/// Keeps a store of what `stream` delivers, notes each change in `journal` and pokes `changed`.
fn reflect_stream<K>(
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    changed: Arc<Wakeups>,
    live: &Liveness,
    journal: Option<Journal>,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&()).to_string();
    let health = live.watch(&kind);
    spawn_reflector(stream, writer, changed, health, journal, kind);
    reader
}

/// Feeds `writer` with what `stream` delivers, notes each change in `journal`, pokes `changed` and
/// reports to `health`.
fn spawn_reflector<K>(
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    writer: reflector::store::Writer<K>,
    changed: Arc<Wakeups>,
    health: WatchHealth,
    journal: Option<Journal>,
    kind: String,
) where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    let stream = stream.reflect(writer);
    tokio::spawn(
        async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        health.ok(matches!(event, watcher::Event::InitDone));
                        if let Some(j) = &journal {
                            j.note(&event);
                        }
                        changed.mark()
                    }
                    // The watcher re-lists and re-watches by itself (with backoff); keep going.
                    Err(e) => {
                        health.failed(&e);
                        warn!(error = %e, "watch error")
                    }
                }
            }
        }
        .instrument(info_span!("watch", %kind)),
    );
}

#[cfg(test)]
mod tests {
    use netwave_api::{NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec, RuleConfig};

    use netwave_runtime::decoded::Decoded;

    use super::{CONFIG_VERIFIED, Verified, cache_node_config, slim_node_config};
    use crate::wire::WireNodeConfig;

    fn rule(priority: u32) -> RuleConfig {
        serde_json::from_value(serde_json::json!({"priority": priority, "table": 100}))
            .expect("a rule")
    }

    /// A config, its hash, and an edit of it that keeps that hash (a tampered spec).
    fn configs() -> (NodeConfig, String, NodeConfig) {
        let config = NodeConfig {
            rules: vec![rule(1000)],
            ..NodeConfig::default()
        };
        let hash = netwave_core::render::config_hash(&config);
        let edited = NodeConfig {
            rules: vec![rule(1000), rule(1)],
            ..NodeConfig::default()
        };
        (config, hash, edited)
    }

    fn nnc(config: NodeConfig, hash: String) -> NodeNetworkConfig {
        NodeNetworkConfig::new(
            "node-1",
            NodeNetworkConfigSpec {
                revision: "rev-1".into(),
                sequence: 1,
                config_hash: hash,
                retry: 0,
                config,
            },
        )
    }

    /// The cache keeps a config only when it does not hash to its configHash: the integrity check
    /// still sees what was edited, and everything verified costs no memory.
    #[test]
    fn a_verified_config_is_dropped_from_the_cache_a_tampered_one_kept() {
        let (config, hash, edited) = configs();
        let mut ok = nnc(config.clone(), hash.clone());
        slim_node_config(&mut ok, &mut Verified::default());
        assert_eq!(ok.spec.config, NodeConfig::default());
        assert_eq!(ok.spec.config_hash, hash);
        assert!(
            ok.metadata
                .annotations
                .unwrap()
                .contains_key(CONFIG_VERIFIED)
        );

        let mut tampered = nnc(edited.clone(), hash);
        slim_node_config(&mut tampered, &mut Verified::default());
        assert_eq!(tampered.spec.config, edited);
        assert!(tampered.metadata.annotations.is_none());
    }

    /// Whoever edits a spec can add any annotation: one naming the cache's own marker is dropped on
    /// arrival, so the edited config stays in the cache and the integrity check still sees it.
    #[test]
    fn a_verified_mark_written_to_the_api_does_not_skip_the_tamper_check() {
        let (_, hash, edited) = configs();
        let mut forged = nnc(edited.clone(), hash);
        forged.metadata.annotations = Some(
            [
                (CONFIG_VERIFIED.to_string(), "true".to_string()),
                ("other".to_string(), "kept".to_string()),
            ]
            .into(),
        );
        slim_node_config(&mut forged, &mut Verified::default());
        assert_eq!(forged.spec.config, edited, "the edited config is kept");
        assert_eq!(
            forged.metadata.annotations,
            Some([("other".to_string(), "kept".to_string())].into()),
            "only the forged mark is gone"
        );
    }

    /// Off the wire, a spec's config is decoded and hashed at its first version and not read at all
    /// for the same uid and generation (a status write); a new generation is read again, and a config
    /// edited under the old hash is kept for the integrity check.
    #[test]
    fn off_the_wire_a_config_is_read_once_per_generation() {
        let (config, hash, edited) = configs();
        let wire = |config: serde_json::Value, generation: i64| -> Decoded<WireNodeConfig> {
            let text = serde_json::json!({
                "metadata": {"name": "node-1", "uid": "u1", "generation": generation,
                             "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
                "spec": {"revision": "rev-1", "sequence": 1, "configHash": hash, "config": config},
            });
            serde_json::from_value(text).expect("decodes")
        };
        let cached = |d: Decoded<NodeNetworkConfig>| d.object().expect("decodes").as_ref().clone();
        let as_json = |c: &NodeConfig| serde_json::to_value(c).expect("encodes");
        let mut verified = Verified::default();

        let first = cached(cache_node_config(wire(as_json(&config), 1), &mut verified));
        assert_eq!(
            first.spec.config,
            NodeConfig::default(),
            "verified and dropped"
        );
        assert!(
            first
                .metadata
                .annotations
                .unwrap()
                .contains_key(CONFIG_VERIFIED)
        );
        assert!(first.metadata.managed_fields.is_none());

        // The same generation again: the config is not read (this one would not even decode).
        let garbage = serde_json::json!({"vrfs": "not a list"});
        let same = cached(cache_node_config(wire(garbage.clone(), 1), &mut verified));
        assert_eq!(same.spec.config, NodeConfig::default(), "not read");

        // A new generation is read: garbage is undecodable, an edit under the old hash is kept.
        let bad = cache_node_config(wire(garbage, 2), &mut verified);
        let error = &bad.undecodable().expect("read, and undecodable").error;
        assert!(error.starts_with("spec.config.vrfs: "), "{error}");
        let tampered = cached(cache_node_config(wire(as_json(&edited), 3), &mut verified));
        assert_eq!(tampered.spec.config, edited, "kept for the integrity check");
        assert!(tampered.metadata.annotations.is_none());
    }

    /// A spec is hashed once per version: an event with the uid and generation of a spec found good
    /// (a status write) is not hashed again; a new generation (the spec was written) or another uid
    /// (deleted and created again) is, and an edited config is kept for the integrity check.
    #[test]
    fn a_spec_is_hashed_once_per_generation() {
        let (config, hash, edited) = configs();
        let versioned = |config: &NodeConfig, uid: &str, generation: i64| {
            let mut c = nnc(config.clone(), hash.clone());
            c.metadata.uid = Some(uid.into());
            c.metadata.generation = Some(generation);
            c
        };
        let mut verified = Verified::default();
        let mut first = versioned(&config, "u1", 1);
        slim_node_config(&mut first, &mut verified);
        assert_eq!(first.spec.config, NodeConfig::default(), "verified");

        // Same uid and generation: the API server says the spec did not change, so it is not hashed
        // again (this config could not come from the API server with that generation: it shows that
        // the hash is not computed).
        let mut same = versioned(&edited, "u1", 1);
        slim_node_config(&mut same, &mut verified);
        assert_eq!(same.spec.config, NodeConfig::default(), "not hashed again");

        for (uid, generation) in [("u1", 2), ("u2", 1)] {
            let mut changed = versioned(&edited, uid, generation);
            slim_node_config(&mut changed, &mut verified);
            assert_eq!(
                changed.spec.config, edited,
                "{uid}/{generation}: hashed, kept"
            );
            assert!(changed.metadata.annotations.is_none());
        }
        // Found bad, it is forgotten: the good spec's generation is hashed again too.
        let mut back = versioned(&edited, "u1", 1);
        slim_node_config(&mut back, &mut verified);
        assert_eq!(back.spec.config, edited, "hashed again after a bad one");
    }

    /// The loop's window counts from the first change it has not taken: a change that waited out
    /// a reconcile's writes is not made to wait the whole window again.
    #[tokio::test(start_paused = true)]
    async fn the_window_counts_from_the_first_change_not_taken() {
        use std::time::Duration;
        use tokio::time::Instant;

        let changes = super::Wakeups::default();
        let first = Instant::now();
        changes.mark();
        tokio::time::advance(Duration::from_millis(40)).await;
        changes.mark();
        assert_eq!(changes.wait().await, first, "the first of two changes");

        changes.take();
        tokio::time::advance(Duration::from_millis(5)).await;
        let second = Instant::now();
        changes.mark();
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(changes.wait().await, second, "taken changes do not count");

        changes.take();
        tokio::time::advance(Duration::from_millis(5)).await;
        changes.wake();
        assert_eq!(
            changes.wait().await,
            Instant::now(),
            "a wake-up without a change"
        );
    }
}
