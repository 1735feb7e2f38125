//! The configurator against the testbed API server, with simulated agents: the rollout contract of
//! DESIGN.md §3 as seen through the API.

mod common;

use netwave_api::vocab::RevisionPhase;
use netwave_api::vocab::{ConditionStatus, NodePhase, NodeReason, RevisionCondition};
use std::time::Duration;

use common::*;
use kube::api::{Api, ListParams};
use netwave_api::NetworkConfigRevision;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_nodes_roll_out_with_at_most_two_in_flight() {
    let env = env().await;
    let names = node_names(10);
    add_nodes(&env.client, &names).await;
    let history = History::record(&env.client);
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(80));
    apply_samples(&env.client).await;
    let (metrics_port, health_port) = (free_port(), free_port());
    let (m, h) = (
        format!("127.0.0.1:{metrics_port}"),
        format!("127.0.0.1:{health_port}"),
    );
    let c = Configurator::start(
        env.client.clone(),
        args(&[
            "--max-unavailable",
            "2",
            "--metrics-addr",
            &m,
            "--health-addr",
            &h,
        ]),
    );

    let rev = eventually(T, "the revision to complete", || async {
        let revs = revisions(&env.client).await;
        match revs.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(r.clone()),
            other => Err(format!(
                "{:?}",
                other
                    .iter()
                    .map(|r| (r.metadata.name.clone(), phase(r)))
                    .collect::<Vec<_>>()
            )),
        }
    })
    .await;
    let status = rev.status.clone().unwrap();
    assert_eq!(
        (
            status.total,
            status.updated,
            status.in_progress,
            status.queued,
            status.failed
        ),
        (10, 10, 0, 0, 0)
    );
    let configs = configs(&env.client).await;
    assert_eq!(configs.len(), 10);
    for (name, c) in &configs {
        let st = c.status.clone().unwrap();
        assert_eq!(
            c.spec.revision,
            rev.metadata.name.clone().unwrap(),
            "{name}"
        );
        assert_eq!(
            st.phase.as_deref(),
            Some(NodePhase::Provisioned.as_str()),
            "{name}"
        );
        assert!(
            !c.spec.config.layer2s.is_empty(),
            "{name} got the sample segments"
        );
    }
    // What an admin's Prometheus sees after the rollout.
    assert_eq!(http_get(health_port, "/healthz").await.0, 200);
    assert_eq!(http_get(health_port, "/readyz").await.0, 200);
    let (code, metrics) = http_get(metrics_port, "/metrics").await;
    assert_eq!(code, 200);
    for line in [
        "netwave_leader 1",
        "netwave_revisions{phase=\"Complete\"} 1",
        "netwave_rollout_nodes{state=\"updated\"} 10",
        "netwave_node_apply_duration_seconds_count 10",
        "netwave_rollout_duration_seconds_count 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing `{line}` in:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("netwave_assignments_total{reason=\"Rollout\"}"),
        "{metrics}"
    );
    // Ten nodes, at most two at a time: five to ten waves, each observed once.
    let waves: u32 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("netwave_wave_duration_seconds_count "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!((5..=10).contains(&waves), "{waves} waves:\n{metrics}");
    c.stop().await;

    // Budget: never more than two nodes in flight, at any point of the watch history.
    let max = history.max_in_flight();
    assert!(max <= 2, "{max} nodes were in flight at once");
    assert!(max == 2, "the budget was used (max in flight {max})");

    // Counters: every status the configurator wrote adds up, and `updated` never goes backwards.
    let mut last_updated = 0;
    let mut statuses = 0;
    for e in history.events() {
        if let Recorded::Revision(r) = e
            && let Some(st) = r.status
        {
            statuses += 1;
            assert_eq!(
                st.updated + st.in_progress + st.queued + st.failed + st.skipped,
                st.total,
                "{st:?}"
            );
            assert!(st.updated >= last_updated, "updated went backwards: {st:?}");
            assert!(st.in_progress <= 2, "{st:?}");
            last_updated = st.updated;
        }
    }
    // Counter moves are written at most once a second (COUNTERS_STATUS_INTERVAL) and this rollout
    // takes about half a second: at least the start and the completion.
    assert!(
        statuses >= 2,
        "status is written as the rollout progresses ({statuses} writes)"
    );
    let conditions = status
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect::<Vec<_>>();
    assert!(
        conditions.contains(&(
            RevisionCondition::Available.as_str(),
            ConditionStatus::True.as_str()
        )),
        "{conditions:?}"
    );
    assert!(
        conditions.contains(&(
            RevisionCondition::Validated.as_str(),
            ConditionStatus::True.as_str()
        )),
        "{conditions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_node_fails_the_revision_and_touched_nodes_go_back() {
    let env = env().await;
    let names = node_names(6);
    add_nodes(&env.client, &names).await;
    // node-02 cannot take any revision but the first one.
    let first: std::sync::Arc<std::sync::Mutex<Option<String>>> = Default::default();
    let f = first.clone();
    let behaviour: Behaviour = std::sync::Arc::new(move |node, rev| {
        let mut first = f.lock().unwrap();
        let first = first.get_or_insert_with(|| rev.to_string());
        if node == "node-02" && rev != first {
            Answer::Invalid {
                reason: Reason::HealthCheckFailed,
                message: "reachability 198.18.0.1:179".into(),
            }
        } else {
            Answer::Provisioned
        }
    });
    let _agents = spawn_agents(env.client.clone(), behaviour, Duration::from_millis(50));
    apply_samples(&env.client).await;
    let (a, port) = args_with_metrics(&["--max-unavailable", "3"]);
    let c = Configurator::start(env.client.clone(), a);
    let good = eventually(T, "the first revision to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => {
                Ok(r.metadata.name.clone().unwrap())
            }
            other => Err(format!("{}", other.len())),
        }
    })
    .await;

    change_inputs(&env.client, 8000).await;
    let bad = eventually(T, "the second revision to fail", || async {
        let revs = revisions(&env.client).await;
        match revs.as_slice() {
            [_, r] if phase(r) == RevisionPhase::Failed.as_str() => Ok(r.clone()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    let bad_name = bad.metadata.name.clone().unwrap();
    let st = bad.status.clone().unwrap();
    assert_eq!(st.failed_nodes.len(), 1, "{st:?}");
    assert_eq!(st.failed_nodes[0].node, "node-02");
    assert!(
        st.failed_nodes[0]
            .reason
            .contains(NodeReason::HealthCheckFailed.as_str()),
        "{st:?}"
    );

    // Every node ends on the last good revision, provisioned.
    eventually(T, "all nodes back on the last good revision", || async {
        let configs = configs(&env.client).await;
        let off: Vec<_> = configs
            .iter()
            .filter(|(_, c)| c.spec.revision != good || in_flight(c))
            .map(|(n, c)| format!("{n}:{}", c.spec.revision))
            .collect();
        if off.is_empty() {
            Ok(())
        } else {
            Err(off.join(","))
        }
    })
    .await;

    // Nothing is assigned the failed revision afterwards, even after more reconciles.
    reconciles_pass(port, 2.0).await;
    let configs = configs(&env.client).await;
    assert!(
        configs.values().all(|c| c.spec.revision == good),
        "a node got {bad_name} again"
    );

    // An Event tells the admin which node failed and why.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), "default");
    let events = events.list(&ListParams::default()).await.unwrap().items;
    let failed = events.iter().find(|e| {
        e.reason.as_deref() == Some("NodeFailed")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(bad_name.as_str())
    });
    let note = failed.and_then(|e| e.note.clone()).unwrap_or_default();
    assert!(
        note.contains("node-02"),
        "NodeFailed event names the node: {events:?}"
    );
    let revs: Vec<NetworkConfigRevision> = revisions(&env.client).await;
    assert_eq!(revs.len(), 2, "no further revision was created");

    // Back to the good inputs and then to the failed ones again: the admin is told, nothing is created.
    change_inputs(&env.client, 9000).await;
    change_inputs(&env.client, 8000).await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), "default");
    eventually(
        T,
        "an event saying the inputs equal the failed revision",
        || async {
            let list = events.list(&ListParams::default()).await.unwrap().items;
            list.iter()
                .find(|e| e.reason.as_deref() == Some("InputsEqualFailedRevision"))
                .and_then(|e| e.note.clone())
                .filter(|n| n.contains(&bad_name) && n.contains("spec.retry"))
                .ok_or_else(|| format!("{} events", list.len()))
        },
    )
    .await;
    assert_eq!(
        revisions(&env.client).await.len(),
        2,
        "no revision is created for failed inputs"
    );
    c.stop().await;
}
