//! DESIGN.md §6, "One bad object never blinds the fleet", on the real kube-apiserver: the CRDs refuse
//! every integer the Rust types cannot read, written as the attacker (an agent's pod-bound token) or a
//! careless admin would; and an object that still cannot be decoded — stored while the CRD had no bound,
//! the way objects from before this fix are — is reported (Event, metric, one log line) and skipped by a
//! configurator that starts after it was stored, while the rest of the fleet rolls on.

mod common;

use netwave_api::vocab::RevisionPhase;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig, RoutingTable};
use netwave_configurator::testing::crds_without_bound as without_bound;
use netwave_runtime::decoded::Decoded;
use serde_json::json;

const T: Duration = Duration::from_secs(60);

/// Installs `crds` and waits until the API server validates with them (see
/// `install_crds_validating`).
async fn install<F, Fut>(
    env: &Env,
    crds: Vec<CustomResourceDefinition>,
    accepted: bool,
    dry_run: F,
) -> String
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    (env.cp()
        .install_crds_validating(&env.client, crds, accepted, dry_run))
    .await
    .unwrap()
}

/// The kind `K` as untyped JSON, for values `K` cannot hold.
fn dynamic<K: kube::Resource<DynamicType = ()>>(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<K>(&()))
}

/// The message of a 422 (the schema refused the object); panics on anything else.
fn refused<T: std::fmt::Debug>(r: Result<T, kube::Error>, what: &str) -> String {
    match r {
        Err(kube::Error::Api(e)) if e.code == 422 => e.message,
        other => panic!("{what} was not refused by the schema: {other:?}"),
    }
}

fn dry() -> PatchParams {
    PatchParams {
        dry_run: true,
        ..PatchParams::default()
    }
}

/// Every object of a kind, as the fixed configurator watches them (a typed list fails on the bad one).
async fn decoded<K>(client: &Client) -> Vec<Decoded<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Api::<Decoded<K>>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// The decodable revisions, by sequence.
async fn good_revisions(client: &Client) -> Vec<NetworkConfigRevision> {
    let mut revs: Vec<NetworkConfigRevision> = decoded::<NetworkConfigRevision>(client)
        .await
        .into_iter()
        .filter_map(|d| d.object().map(|r| (**r).clone()))
        .collect();
    revs.sort_by_key(|r| r.spec.sequence);
    revs
}

/// The configurator binary (a restart, as after a failover), its log kept in a file.
struct Proc {
    child: Child,
    log: PathBuf,
    metrics_port: u16,
}

impl Proc {
    fn start(env: &Env, name: &str) -> Proc {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log =
            std::env::temp_dir().join(format!("netwave-{name}-{}-{n}.log", std::process::id()));
        let metrics_port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_netwave-configurator"))
            .args(["--kubeconfig", env.kubeconfig().to_str().unwrap()])
            .args(["--lease-namespace", "netwave-system", "--identity", name])
            .args(["--lease-duration", "2s", "--renew-deadline", "1500ms"])
            .args(["--retry-period", "250ms"])
            .args(["--max-unavailable", "1", "--resync-interval", "2s"])
            .args(["--input-settle", "300ms", "--log-format", "text"])
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
            .args(["--health-addr", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Proc {
            child,
            log,
            metrics_port,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until it has reconciled `n` more times: a negative ("nothing was cut") holds over them.
    async fn reconciles_pass(&self, n: f64) {
        reconciles_pass(self.metrics_port, n).await
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- configurator log ({}):\n{}",
                self.log.display(),
                self.log()
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The attacker of the issue: an agent writes an integer into its own NodeNetworkConfig status that the
/// configurator reads as `u32`. RBAC and the admission policy allow the write (its own node's status);
/// the schema refuses the value. A careless admin fares the same with a route metric, a revision's
/// `spec.retry` and its rollout knobs.
#[tokio::test]
async fn no_one_can_store_an_integer_the_configurator_cannot_decode() {
    let env = env().await;
    let agent = agent_on(&env, "node-a").await;
    create_node(&env.client, &node("node-a", &[])).await;
    let nnc: NodeNetworkConfig = serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig",
        "metadata": {"name": "node-a"},
        "spec": {"revision": "r1", "sequence": 1, "configHash": "h1", "config": {}},
    }))
    .unwrap();
    Api::<NodeNetworkConfig>::all(env.client.clone())
        .create(&PostParams::default(), &nnc)
        .await
        .unwrap();
    let nncs: Api<NodeNetworkConfig> = Api::all(agent);
    let pp = PatchParams::default();
    nncs.patch_status(
        "node-a",
        &pp,
        &Patch::Merge(json!({"status": {"observedRetry": 4294967295u64}})),
    )
    .await
    .expect("the largest u32 is the agent's to write");
    let msg = refused(
        nncs.patch_status(
            "node-a",
            &pp,
            &Patch::Merge(json!({"status": {"observedRetry": 4294967296u64}})),
        )
        .await,
        "the agent's observedRetry 2^32",
    );
    assert!(
        msg.contains("status.observedRetry")
            && msg.contains("should be less than or equal to 4294967295"),
        "{msg}"
    );

    // The admin writes JSON (kubectl): the Rust types could not even hold these values.
    let admin = env.client.clone();
    let rt: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1", "kind": "RoutingTable",
        "metadata": {"name": "edge"},
        "spec": {"tableId": 100, "routes": [{"prefix": "10.9.0.0/16", "via": "10.0.0.1",
                                             "metric": 4294967296u64}]},
    }))
    .unwrap();
    let msg = refused(
        dynamic::<RoutingTable>(&admin)
            .create(&PostParams::default(), &rt)
            .await,
        "a route metric of 2^32",
    );
    assert!(
        msg.contains("spec.routes[0].metric")
            && msg.contains("should be less than or equal to 4294967295"),
        "{msg}"
    );
    let revs = dynamic::<NetworkConfigRevision>(&admin);
    for (field, value, max) in [
        ("retry", json!(4294967296u64), "4294967295"),
        (
            "rollout",
            json!({"maxFailures": 4294967296u64}),
            "4294967295",
        ),
        (
            "rollout",
            json!({"maxUnavailable": 2147483648u64}),
            "2147483647",
        ),
    ] {
        let rev: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "netwave.dev/v1alpha1", "kind": "NetworkConfigRevision",
            "metadata": {"name": "rev-x"},
            "spec": {"hash": "x", "sequence": 1, field: value},
        }))
        .unwrap();
        let msg = refused(
            revs.create(&PostParams::default(), &rev).await,
            &format!("spec.{field} {value}"),
        );
        assert!(
            msg.contains(&format!("spec.{field}"))
                && msg.contains(&format!("should be less than or equal to {max}")),
            "{msg}"
        );
    }
}

/// The failure, reproduced as it happened: while the CRD had no bound, node-01's agent stored
/// `status.observedRetry: 4294967296` in its own NodeNetworkConfig. A configurator started afterwards
/// (a restart or failover) reports it — an Event on it naming the field, the gauge, one log line — and
/// skips that node (state unknown: not updated, not failed, never written) while the other nodes roll
/// out the next revision under a budget of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_config_that_cannot_be_decoded_is_reported_and_skipped_and_the_fleet_rolls_on() {
    let env = env().await;
    // Untyped: the answer to the bad write holds the value the Rust types cannot.
    let agent = dynamic::<NodeNetworkConfig>(&agent_on(&env, "node-01").await);
    let names = node_names(4);
    add_nodes(&env.client, &names).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(50));
    apply_samples(&env.client).await;
    let first = Proc::start(&env, "configurator-a");
    let rev1 = eventually(T, "the first rollout to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(r.name_any()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    drop(first);

    let bad = Patch::Merge(json!({"status": {"observedRetry": 4294967296u64}}));
    install(
        &env,
        without_bound(&[(
            "nodenetworkconfigs.yaml",
            "/properties/status/properties/observedRetry",
        )]),
        true,
        || async { agent.patch_status("node-01", &dry(), &bad).await.map(drop) },
    )
    .await;
    agent
        .patch_status("node-01", &PatchParams::default(), &bad)
        .await
        .expect("stored while the CRD had no bound");
    // The bound back. The stored value stays (the API server ratchets: a write that leaves an invalid
    // field as it is passes), so the probe writes another out-of-range value.
    let worse = Patch::Merge(json!({"status": {"observedRetry": 4294967297u64}}));
    let msg = install(
        &env,
        netwave_api::crds().into_iter().map(|(_, c)| c).collect(),
        false,
        || async {
            agent
                .patch_status("node-01", &dry(), &worse)
                .await
                .map(drop)
        },
    )
    .await;
    assert!(
        msg.contains("should be less than or equal to 4294967295"),
        "{msg}"
    );

    change_inputs(&env.client, 1400).await;
    let c = Proc::start(&env, "configurator-b");
    let rev2 = eventually(
        T,
        "the next revision to complete without node-01",
        || async {
            match good_revisions(&env.client).await.as_slice() {
                [_, r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(r.clone()),
                other => Err(format!(
                    "{:?}",
                    other
                        .iter()
                        .map(|r| (r.name_any(), phase(r)))
                        .collect::<Vec<_>>()
                )),
            }
        },
    )
    .await;
    let st = rev2.status.clone().unwrap();
    assert_eq!(
        (st.total, st.updated, st.skipped, st.failed),
        (4, 3, 1, 0),
        "{st:?}"
    );
    assert!(
        st.message.as_deref().is_some_and(|m| m.contains(
            "1 node(s) whose NodeNetworkConfig cannot be decoded, state unknown, left for later: node-01"
        )),
        "{st:?}"
    );
    let mut on = Vec::new();
    for d in decoded::<NodeNetworkConfig>(&env.client).await {
        match d {
            Decoded::Object(n) => on.push((n.name_any(), n.spec.revision.clone())),
            Decoded::Undecodable(u) => on.push((
                u.metadata.name.clone().unwrap(),
                format!("undecodable: {}", u.error),
            )),
        }
    }
    on.sort();
    let r2 = rev2.name_any();
    assert_eq!(
        on,
        [
            ("node-00".to_string(), r2.clone()),
            (
                "node-01".into(),
                "undecodable: status.observedRetry: invalid value: integer `4294967296`, \
                 expected u32"
                    .into()
            ),
            ("node-02".into(), r2.clone()),
            ("node-03".into(), r2),
        ],
        "node-01 was not written (still on {rev1})"
    );

    let notes = eventually(T, "an Undecodable Event on node-01", || async {
        let n = event_notes(&env.client, "node-01", "Undecodable").await;
        if n.is_empty() {
            Err("none yet".to_string())
        } else {
            Ok(n)
        }
    })
    .await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with(
            "NodeNetworkConfig node-01 cannot be decoded (status.observedRetry: invalid value: \
             integer `4294967296`, expected u32): node node-01's state is unknown"
        ),
        "{notes:?}"
    );
    assert_eq!(
        metric(
            c.metrics_port,
            "netwave_undecodable_objects{kind=\"NodeNetworkConfig\"} "
        )
        .await,
        Some(1.0)
    );
    // One log line naming it, not one per reconcile.
    c.reconciles_pass(3.0).await;
    let log = c.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("NodeNetworkConfig node-01 cannot be decoded"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
}

/// An input object stored while the CRD had no bound (a route metric of 2^32) must not silently vanish
/// from the next revision — that would remove its routes from every node. A configurator started
/// afterwards cuts no revision while it cannot be decoded (reported by an Event on it and the gauge), even
/// when other inputs change; once an admin fixes it, the revision is cut with it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_that_cannot_be_decoded_holds_revision_cutting_instead_of_vanishing() {
    let env = env().await;
    let names = node_names(3);
    add_nodes(&env.client, &names).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(50));
    apply_samples(&env.client).await;
    let first = Proc::start(&env, "configurator-a");
    eventually(T, "the first rollout to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    drop(first);

    let rts = dynamic::<RoutingTable>(&env.client);
    let metric_of = |m: u64| {
        Patch::<()>::Json(
            serde_json::from_value(json!([
                {"op": "replace", "path": "/spec/routes/0/metric", "value": m}
            ]))
            .unwrap(),
        )
    };
    let bad = metric_of(4294967296);
    install(
        &env,
        without_bound(&[(
            "routingtables.yaml",
            "/properties/spec/properties/routes/items/properties/metric",
        )]),
        true,
        || async { rts.patch("oob", &dry(), &bad).await.map(drop) },
    )
    .await;
    rts.patch("oob", &PatchParams::default(), &bad)
        .await
        .expect("stored while the CRD had no bound");
    let worse = metric_of(4294967297);
    install(
        &env,
        netwave_api::crds().into_iter().map(|(_, c)| c).collect(),
        false,
        || async { rts.patch("oob", &dry(), &worse).await.map(drop) },
    )
    .await;

    // Another input changes too: without the hold, a revision without `oob` would be cut now.
    change_inputs(&env.client, 1400).await;
    let c = Proc::start(&env, "configurator-b");
    let notes = eventually(T, "an Undecodable Event on the routing table", || async {
        let n = event_notes(&env.client, "oob", "Undecodable").await;
        if n.is_empty() {
            Err("none yet".to_string())
        } else {
            Ok(n)
        }
    })
    .await;
    assert!(
        notes[0].starts_with(
            "RoutingTable oob cannot be decoded (spec.routes[0].metric: invalid value: integer \
             `4294967296`, expected u32): no revision is cut from the inputs until it is fixed"
        ),
        "{notes:?}"
    );
    assert_eq!(
        metric(
            c.metrics_port,
            "netwave_undecodable_objects{kind=\"RoutingTable\"} "
        )
        .await,
        Some(1.0)
    );
    c.reconciles_pass(3.0).await;
    assert_eq!(revisions(&env.client).await.len(), 1, "no revision was cut");

    // Fixed by an admin: the revision is cut, with the routing table in it.
    rts.patch("oob", &PatchParams::default(), &metric_of(50))
        .await
        .unwrap();
    let rev2 = eventually(T, "a revision cut with the fixed routing table", || async {
        match revisions(&env.client).await.as_slice() {
            [_, r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(r.name_any()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    let inputs = Api::<netwave_api::NetworkConfigInputs>::all(env.client.clone())
        .get(&rev2)
        .await
        .unwrap();
    let oob = inputs
        .spec
        .routing_tables
        .iter()
        .find(|r| r.name == "oob")
        .expect("oob is in the new revision");
    assert_eq!(oob.spec.routes[0].metric, Some(50));
    eventually(T, "the gauge back to 0", || async {
        match metric(
            c.metrics_port,
            "netwave_undecodable_objects{kind=\"RoutingTable\"} ",
        )
        .await
        {
            Some(0.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}
