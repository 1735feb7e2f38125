//! The writer against the testbed (#28): what it sends for the intents a plan gives it.

mod common;

use std::time::Duration;

use common::testbed_env;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use netwave_api::{
    ASSIGNED_AT_ANNOTATION, InputStatus, NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec,
    QUEUED_ANNOTATION, RoutingTable,
};
use netwave_configurator::lease::{Elector, LeaseConfig};
use netwave_configurator::metrics::Metrics;
use netwave_configurator::writer::{Intent, Writer};
use netwave_core::render::InputKind;

fn spec(revision: &str) -> NodeNetworkConfigSpec {
    let config = NodeConfig::default();
    NodeNetworkConfigSpec {
        revision: revision.into(),
        sequence: 1,
        config_hash: netwave_core::render::config_hash(&config),
        retry: 0,
        config,
    }
}

fn assign(revision: &str, at: &str, based_on: Option<String>) -> Intent {
    Intent::ApplyNodeConfig {
        node: "node-1".into(),
        spec: Box::new(spec(revision)),
        assigned_at: Some(at.into()),
        clear_queued: false,
        based_on,
        pending: None,
    }
}

/// The annotation `key` of node-1's config, as the server has it now.
async fn node_1_annotation(nncs: &Api<NodeNetworkConfig>, key: &str) -> String {
    nncs.get("node-1")
        .await
        .expect("node-1")
        .metadata
        .annotations
        .unwrap_or_default()[key]
        .clone()
}

/// Sends one intent through `writer`: what came of it as (written, repeated, failed).
async fn send(writer: &mut Writer, intent: Intent, metrics: &Metrics) -> (usize, usize, usize) {
    let out = writer.execute(vec![intent], metrics).await;
    (out.written, out.repeated, out.failed)
}

/// A writer that leads (its elector runs until the returned task is dropped with the runtime).
async fn leading_writer(client: &kube::Client) -> (Writer, tokio::task::JoinHandle<()>) {
    let (elector, gate) = Elector::new(
        client.clone(),
        LeaseConfig {
            namespace: "netwave-system".into(),
            name: "netwave-configurator".into(),
            identity: "writer-test".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_millis(100),
        },
    );
    let elector = tokio::spawn(elector.run(std::future::pending::<()>()));
    let mut waiting = gate.clone();
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    assert!(waiting.leads_by(until).await, "no leadership");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "netwave-configurator".into(),
            instance: None,
        },
    );
    let writer = Writer::new(client.clone(), gate, recorder);
    (writer, elector)
}

/// On kube-apiserver the leader's cache shows its own assignment some time after it was written; a
/// reconcile in between plans the same assignment again (bench_fleet at 1,000 nodes: 1.15–1.39 spec
/// writes per node and rollout instead of 1, most within 0.15 s of the first). Each such write moved
/// `assigned-at` and sent the whole node config to every watch. Planned on the same view of the node
/// config as a write already made, it is not sent; on a newer view (someone changed the config since)
/// it is.
#[tokio::test]
async fn an_assignment_planned_again_on_the_view_it_was_written_over_is_not_sent_again() {
    let env = testbed_env().await;
    let tb = env.tb();
    let (mut writer, _elector) = leading_writer(&env.client).await;
    let metrics = Metrics::default();
    let nncs: Api<NodeNetworkConfig> = Api::all(env.client.clone());
    let placeholder = nncs
        .create(
            &PostParams::default(),
            &NodeNetworkConfig::new("node-1", NodeNetworkConfigSpec::placeholder()),
        )
        .await
        .expect("placeholder");
    let view = placeholder.metadata.resource_version.clone();
    let patches = || tb.counters().get("patch", "nodenetworkconfigs");
    let assigned_at = || node_1_annotation(&nncs, ASSIGNED_AT_ANNOTATION);

    assert_eq!(
        send(
            &mut writer,
            assign("r1", "2026-11-26T07:00:00Z", view.clone()),
            &metrics
        )
        .await,
        (1, 0, 0)
    );
    assert_eq!(patches(), 1);

    // The next plan, on the view the write went over: nothing sent, the assignment time stands.
    assert_eq!(
        send(
            &mut writer,
            assign("r1", "2026-11-26T07:00:01Z", view.clone()),
            &metrics
        )
        .await,
        (0, 1, 0)
    );
    assert_eq!(patches(), 1, "the same assignment was sent again");
    assert_eq!(assigned_at().await, "2026-11-26T07:00:00Z");

    // Another spec on that view is sent.
    assert_eq!(
        send(
            &mut writer,
            assign("r2", "2026-11-26T07:00:02Z", view.clone()),
            &metrics
        )
        .await,
        (1, 0, 0)
    );
    assert_eq!(patches(), 2);

    // The same spec on a newer view (the config was changed after the write, e.g. by hand) is sent.
    let now = nncs.get("node-1").await.expect("node-1");
    assert_eq!(
        send(
            &mut writer,
            assign(
                "r2",
                "2026-11-26T07:00:03Z",
                now.metadata.resource_version.clone(),
            ),
            &metrics
        )
        .await,
        (1, 0, 0)
    );
    assert_eq!(patches(), 3);
    assert_eq!(assigned_at().await, "2026-11-26T07:00:03Z");
}

/// The same for placeholders: a plan made before the cache shows a placeholder this replica created
/// creates it again, which fails as a conflict and stops the writes behind it (bench_fleet on
/// kube-apiserver at 1,000 nodes: 1,045 creates for 1,000 nodes). Planned again on no view, it is
/// not sent; a new message over the placeholder as read is.
#[tokio::test]
async fn a_placeholder_planned_again_before_the_cache_shows_it_is_not_created_again() {
    let env = testbed_env().await;
    let tb = env.tb();
    let (mut writer, _elector) = leading_writer(&env.client).await;
    let metrics = Metrics::default();
    let nncs: Api<NodeNetworkConfig> = Api::all(env.client.clone());
    let queue = |message: &str, resource_version: Option<String>| Intent::QueueNode {
        node: "node-1".into(),
        message: message.into(),
        resource_version,
    };
    let creates = || tb.counters().get("create", "nodenetworkconfigs");
    let said = || node_1_annotation(&nncs, QUEUED_ANNOTATION);

    assert_eq!(
        send(&mut writer, queue("waits", None), &metrics).await,
        (1, 0, 0)
    );
    assert_eq!(
        send(&mut writer, queue("waits", None), &metrics).await,
        (0, 1, 0)
    );
    assert_eq!(creates(), 1, "the placeholder was created again");

    let read = nncs.get("node-1").await.expect("node-1");
    assert_eq!(
        send(
            &mut writer,
            queue("not Ready", read.metadata.resource_version.clone()),
            &metrics
        )
        .await,
        (1, 0, 0)
    );
    assert_eq!(said().await, "not Ready");
}

/// A plan's assignment carries no time: the writer stamps `assigned-at` when it sends the write. The
/// pickup and apply deadlines count from it, so a plan whose writes waited in line on a slow API server
/// (kube-apiserver at 15,000 nodes: tens of seconds for a first wave of 1,500) does not charge that
/// wait to the agents.
#[tokio::test]
async fn a_plans_assignment_is_stamped_when_it_is_sent() {
    let env = testbed_env().await;
    let (mut writer, _elector) = leading_writer(&env.client).await;
    let metrics = Metrics::default();
    let planned = Intent::ApplyNodeConfig {
        node: "node-1".into(),
        spec: Box::new(spec("r1")),
        assigned_at: None,
        clear_queued: false,
        based_on: None,
        pending: None,
    };
    // The stamp has millisecond precision.
    let before = Timestamp::now() - SignedDuration::from_millis(1);
    let out = writer.execute(vec![planned], &metrics).await;
    let after = Timestamp::now();
    assert_eq!(out.written, 1);
    let nncs: Api<NodeNetworkConfig> = Api::all(env.client.clone());
    let at: Timestamp = nncs
        .get("node-1")
        .await
        .expect("node-1")
        .metadata
        .annotations
        .unwrap_or_default()[ASSIGNED_AT_ANNOTATION]
        .parse()
        .expect("an RFC 3339 time");
    assert!(
        before <= at && at <= after,
        "assigned-at {at}: sent between {before} and {after}"
    );
}

/// An input object's status planned again before the cache shows this replica's write of it (a plan
/// on the same view of the object) is not sent again: on a loaded machine a rollout wrote 19-20
/// statuses for 18 objects. Planned on the view that shows someone else's change, it is written.
#[tokio::test]
async fn an_input_status_planned_again_before_the_cache_shows_it_is_not_written_again() {
    let env = testbed_env().await;
    let tb = env.tb();
    let (mut writer, _elector) = leading_writer(&env.client).await;
    let metrics = Metrics::default();
    let tables: Api<RoutingTable> = Api::all(env.client.clone());
    let table: RoutingTable = serde_json::from_value(serde_json::json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "t1"},
        "spec": {"tableId": 100},
    }))
    .expect("a RoutingTable");
    let read = tables
        .create(&PostParams::default(), &table)
        .await
        .expect("created");
    // Judged as a plan judges: `Accepted` since `at` (the plan's time, when the view shows no
    // condition yet).
    let judged_at = |revision: &str, at: i64, based_on: Option<String>| Intent::InputStatus {
        kind: InputKind::RoutingTable,
        name: "t1".into(),
        status: Box::new(InputStatus {
            conditions: vec![Condition {
                type_: "Accepted".into(),
                status: "True".into(),
                reason: "Valid".into(),
                message: format!("in {revision}"),
                last_transition_time: Time(Timestamp::from_second(at).expect("a time")),
                observed_generation: read.metadata.generation,
            }],
            revision: Some(revision.into()),
            observed_generation: read.metadata.generation,
            ..Default::default()
        }),
        based_on,
    };
    let judged = |revision: &str, based_on| judged_at(revision, 1_800_000_000, based_on);
    let writes = || tb.counters().get("patch", "routingtables/status");
    let view = read.metadata.resource_version.clone();

    assert_eq!(
        send(&mut writer, judged("r1", view.clone()), &metrics).await,
        (1, 0, 0)
    );
    assert_eq!(
        send(&mut writer, judged("r1", view.clone()), &metrics).await,
        (0, 1, 0)
    );
    // Planned a second later on the same view: the transition is stamped with that plan's time, and
    // it is the same transition.
    assert_eq!(
        send(
            &mut writer,
            judged_at("r1", 1_800_000_001, view.clone()),
            &metrics
        )
        .await,
        (0, 1, 0)
    );
    assert_eq!(writes(), 1, "the same status was written again");

    // A different status on the same view is written; so is the same one on a newer view (someone
    // changed the status since).
    assert_eq!(
        send(&mut writer, judged("r2", view), &metrics).await,
        (1, 0, 0)
    );
    let now = tables.get_status("t1").await.expect("t1");
    assert_eq!(
        send(
            &mut writer,
            judged("r2", now.metadata.resource_version.clone()),
            &metrics
        )
        .await,
        (1, 0, 0)
    );
    assert_eq!(writes(), 3);
    let status = tables.get_status("t1").await.expect("t1").status;
    assert_eq!(status.and_then(|s| s.revision).as_deref(), Some("r2"));
}
