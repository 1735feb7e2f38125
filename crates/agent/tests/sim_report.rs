//! Simulated agents report like the real agent (#28): `Provisioning` when they pick a spec up — the
//! configurator counts the apply timeout from its `lastTransitionTime` — then their answer, each written
//! as the agent writes it. On the testbed: no root, no kernel.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use netwave_agent::reconcile::{Reason, Target};
use netwave_agent::shell::status;
use netwave_agent::sim::{self, Answer};
use netwave_api::vocab::NodePhase;
use netwave_api::{NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec};
use netwave_testbed::{Action, Budget, Match, Rule, Testbed, TestbedOptions};
use serde_json::json;

fn config(table: u32) -> NodeConfig {
    NodeConfig {
        rules: vec![
            serde_json::from_value(json!({"priority": 1000, "table": table})).expect("a rule"),
        ],
        ..NodeConfig::default()
    }
}

fn spec(rev: &str, config: NodeConfig) -> NodeNetworkConfigSpec {
    NodeNetworkConfigSpec {
        revision: rev.into(),
        sequence: 1,
        config_hash: netwave_core::render::config_hash(&config),
        retry: 0,
        config,
    }
}

fn phase(o: &NodeNetworkConfig) -> (String, String) {
    let st = o.status.clone().unwrap_or_default();
    (
        st.observed_revision.unwrap_or_default(),
        st.phase.unwrap_or_default(),
    )
}

#[tokio::test]
async fn a_simulated_agent_reports_provisioning_at_pick_up_then_its_answer_as_the_real_agent() {
    let crds: Vec<_> = netwave_api::crds().into_iter().map(|(_, c)| c).collect();
    let tb = Testbed::start(TestbedOptions::default().with_crds(crds))
        .await
        .expect("testbed");
    let api: Api<NodeNetworkConfig> = Api::all(tb.client());
    let r1 = api
        .create(
            &PostParams::default(),
            &NodeNetworkConfig::new("n1", spec("r1", config(100))),
        )
        .await
        .expect("create n1");
    // r1 answered long ago: its Provisioned time must not carry over into r2's reports.
    let mut answered = sim::status_for(&r1, &Answer::Provisioned).expect("an answer");
    answered["status"]["lastTransitionTime"] = json!("2020-01-01T00:00:00Z");
    sim::write_status(&api, "n1", &answered, 10)
        .await
        .expect("r1's answer written");
    let r2 = api
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec("r2", config(200))})),
        )
        .await
        .expect("assign r2");
    let prev = r2.status.clone().expect("r1's status");

    let seen = tokio::spawn({
        let api = api.clone();
        async move {
            let mut phases = Vec::new();
            let stream = watcher(api, watcher::Config::default()).applied_objects();
            futures::pin_mut!(stream);
            while let Some(Ok(o)) = stream.next().await {
                let p = phase(&o);
                if p.0 == "r2" && phases.last() != Some(&p.1) {
                    phases.push(p.1.clone());
                }
                if p == ("r2".into(), NodePhase::Provisioned.as_str().into()) {
                    return phases;
                }
            }
            phases
        }
    });
    let written = sim::report(
        &api,
        &r2,
        &Answer::Provisioned,
        Duration::from_millis(300),
        10,
    )
    .await;
    assert_eq!(
        written.len(),
        2,
        "two writes: Provisioning, then the answer"
    );

    // The pick-up report is the real agent's (status::provisioning, judged for r2's generation) at
    // the time it carries.
    let picked = written[0].status.clone().expect("a status");
    let at = picked.last_transition_time.clone().expect("a start time");
    let provisioning = status::provisioning(
        &Target::from(&r2.spec),
        Some(&prev),
        &Default::default(),
        at.clone(),
    );
    assert_eq!(picked, status::judged(provisioning, &r2, &at));
    assert_eq!(picked.observed_generation, r2.metadata.generation);
    assert_eq!(
        picked.phase.as_deref(),
        Some(NodePhase::Provisioning.as_str())
    );
    assert_eq!(picked.observed_revision.as_deref(), Some("r2"));
    assert_eq!(
        picked.observed_config_hash.as_deref(),
        Some(r2.spec.config_hash.as_str())
    );
    assert_eq!(
        picked.config_hash, prev.config_hash,
        "while applying, the node still runs r1"
    );
    assert!(at.0 > prev.last_transition_time.clone().expect("r1's time").0);

    let done = written[1].status.clone().expect("a status");
    assert_eq!(done.phase.as_deref(), Some(NodePhase::Provisioned.as_str()));
    assert_eq!(
        done.config_hash.as_deref(),
        Some(r2.spec.config_hash.as_str())
    );
    assert!(
        done.last_transition_time.clone().expect("a time").0 >= at.0,
        "the answer's time is its own, not r1's: {done:?}"
    );

    // Both through the agent's server-side apply of the status subresource.
    let mf = written[1].managed_fields();
    assert!(
        mf.iter()
            .any(|m| m.manager.as_deref() == Some("netwave-agent")
                && m.operation.as_deref() == Some("Apply")
                && m.subresource.as_deref() == Some("status")),
        "{mf:?}"
    );
    let phases = tokio::time::timeout(Duration::from_secs(10), seen)
        .await
        .expect("the watch saw r2 answered")
        .expect("watch task");
    assert_eq!(
        phases,
        [
            NodePhase::Provisioning.as_str(),
            NodePhase::Provisioned.as_str()
        ]
    );

    // A dead agent never starts: nothing written. A failing one starts, then reports Invalid.
    assert!(
        sim::report(&api, &r2, &Answer::Silent, Duration::ZERO, 10)
            .await
            .is_empty()
    );
    let r3 = api
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec("r3", config(300))})),
        )
        .await
        .expect("assign r3");
    let failing = Answer::Invalid {
        reason: Reason::ApplyFailed,
        message: "ApplyFailed: simulated".into(),
    };
    let written = sim::report(&api, &r3, &failing, Duration::ZERO, 10).await;
    let phases: Vec<_> = written.iter().map(phase).collect();
    assert_eq!(
        phases,
        [
            (
                "r3".to_string(),
                NodePhase::Provisioning.as_str().to_string()
            ),
            ("r3".to_string(), NodePhase::Invalid.as_str().to_string())
        ]
    );
    assert_eq!(
        written[1].status.clone().unwrap_or_default().config_hash,
        Some(r2.spec.config_hash.clone()),
        "rolled back to what ran before: r2"
    );
}

async fn testbed_with(
    name: &str,
    spec: NodeNetworkConfigSpec,
) -> (Testbed, Api<NodeNetworkConfig>) {
    let crds: Vec<_> = netwave_api::crds().into_iter().map(|(_, c)| c).collect();
    let tb = Testbed::start(TestbedOptions::default().with_crds(crds))
        .await
        .expect("testbed");
    let api: Api<NodeNetworkConfig> = Api::all(tb.client());
    api.create(&PostParams::default(), &NodeNetworkConfig::new(name, spec))
        .await
        .expect("create the node config");
    (tb, api)
}

/// Waits until `name`'s status reads `want` (observed revision and retry, phase).
async fn reads(
    api: &Api<NodeNetworkConfig>,
    name: &str,
    want: (&str, u32, NodePhase),
    within: Duration,
) {
    let end = tokio::time::Instant::now() + within;
    loop {
        let st = api.get(name).await.expect("get").status.unwrap_or_default();
        let now = (
            st.observed_revision.clone().unwrap_or_default(),
            st.observed_retry.unwrap_or(0),
            st.phase.clone().unwrap_or_default(),
        );
        if now == (want.0.to_string(), want.1, want.2.as_str().to_string()) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{name} reads {now:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A status write the API server never answers (a connection left half-open by an API server
/// restart) is given up after the agent's attempt timeout and sent again: the answer still arrives.
#[tokio::test]
async fn a_simulated_agents_write_that_is_never_answered_is_sent_again() {
    let (tb, api) = testbed_with("n1", spec("r1", config(100))).await;
    // The first status write is held far longer than the test waits.
    tb.faults().add(Rule {
        matcher: Match::verb("patch").resource("nodenetworkconfigs/status"),
        action: Action::Delay(Duration::from_secs(600)),
        budget: Budget::Next(1),
    });
    let _agent = Aborted(sim::spawn_node(
        tb.client(),
        "n1",
        sim::always_ok(),
        Duration::from_millis(100),
    ));
    let within = netwave_agent::shell::report::ATTEMPT_TIMEOUT + Duration::from_secs(10);
    reads(&api, "n1", ("r1", 0, NodePhase::Provisioned), within).await;
}

/// A newer spec supersedes the answer still on its way for the older one, as the real agent's newest
/// status replaces one not yet written: the node's last word answers the spec it has now, never the
/// one before (which would leave the configurator waiting for an answer that never comes).
#[tokio::test]
async fn a_simulated_agents_answer_to_a_superseded_spec_never_lands_over_the_newer_one() {
    let (tb, api) = testbed_with("n1", spec("r1", config(100))).await;
    // The first spec takes 3 s to apply, its retry 0.1 s.
    let pace: sim::Pace = Arc::new(|nnc: &NodeNetworkConfig| match nnc.spec.retry {
        0 => Duration::from_secs(3),
        _ => Duration::from_millis(100),
    });
    let _agent = Aborted(sim::spawn_node_paced(
        tb.client(),
        "n1",
        sim::always_ok(),
        pace,
    ));
    reads(
        &api,
        "n1",
        ("r1", 0, NodePhase::Provisioning),
        Duration::from_secs(10),
    )
    .await;
    api.patch(
        "n1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"retry": 1}})),
    )
    .await
    .expect("retry r1");
    reads(
        &api,
        "n1",
        ("r1", 1, NodePhase::Provisioned),
        Duration::from_secs(10),
    )
    .await;
    // Past the moment the first spec's answer was due.
    tokio::time::sleep(Duration::from_secs(4)).await;
    reads(
        &api,
        "n1",
        ("r1", 1, NodePhase::Provisioned),
        Duration::ZERO,
    )
    .await;
}

/// Aborts a spawned agent when the test ends.
struct Aborted(tokio::task::JoinHandle<()>);

impl Drop for Aborted {
    fn drop(&mut self) {
        self.0.abort();
    }
}
