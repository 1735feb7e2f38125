//! #27 item 10, one compromised agent's veto, on the real kube-apiserver with `deploy/base` installed.
//! The attacker holds what a compromised agent holds: the service-account token the kubelet mounts into
//! the agent's pod on node-a. From some point on it reports `Invalid` on every new config node-a is given
//! (and `Provisioned` on the one it runs, so rollbacks finish). The other nodes' agents apply everything.
//!
//! - Default (no quarantine policy): every revision fails on node-a (maxFailures 1) and no other node
//!   keeps it: one node vetoes every change. That is what netwave does unless told otherwise.
//! - `--quarantine-after 2`: node-a is quarantined after failing two revisions the other nodes had
//!   provisioned (it goes last once it is a suspect); the next revisions reach every other node while
//!   node-a keeps its last good config. The record is in annotations the attacker's token cannot write;
//!   the condition it can delete is put back; an admin releases the node.

mod common;

use netwave_api::vocab::ConditionStatus;
use netwave_api::vocab::{NodePhase, RevisionPhase};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use netwave_api::{
    NetworkConfigRevision, NodeNetworkConfig, QUARANTINED_ANNOTATION, QUARANTINED_CONDITION,
};
use serde_json::json;

const T: Duration = Duration::from_secs(60);
const HOSTILE: &str = "node-a";
const NODES: [&str; 4] = ["node-a", "node-b", "node-c", "node-d"];

struct Fleet {
    env: Env,
    attacker: Client,
    hostile: Arc<AtomicBool>,
    metrics_port: u16,
    first: String,
    _configurator: Configurator,
    _agents: Task,
    _attacker_agent: Task,
}

/// Four nodes on the samples' first revision, completed; node-a's agent answers with the attacker's
/// token and turns hostile when `hostile` is set.
async fn fleet(extra: &[&str]) -> Fleet {
    let env = env().await;
    let attacker = agent_on(&env, HOSTILE).await;
    for n in NODES {
        create_node(
            &env.client,
            &node(
                n,
                &[("node-restriction.kubernetes.io/netwave-pool", "compute")],
            ),
        )
        .await;
    }
    let honest = Arc::new(|node: &str, _: &str| {
        if node == HOSTILE {
            Answer::Silent
        } else {
            Answer::Provisioned
        }
    });
    let agents = spawn_agents(env.client.clone(), honest, Duration::from_millis(100));
    let hostile = Arc::new(AtomicBool::new(false));
    let flag = hostile.clone();
    let attacker_agent = Task(netwave_agent::sim::spawn(
        attacker.clone(),
        Arc::new(move |nnc: &NodeNetworkConfig| {
            let runs_it = nnc.status.as_ref().and_then(|s| s.config_hash.as_deref())
                == Some(nnc.spec.config_hash.as_str());
            if nnc.name_any() != HOSTILE {
                Answer::Silent
            } else if flag.load(Ordering::SeqCst) && !runs_it {
                Answer::Invalid {
                    reason: Reason::ApplyFailed,
                    message: "route add failed: Invalid argument".into(),
                }
            } else {
                Answer::Provisioned
            }
        }),
        Duration::from_millis(50),
    ));
    apply_samples(&env.client).await;
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut argv = vec!["--metrics-addr", metrics.as_str()];
    argv.extend_from_slice(extra);
    let configurator = Configurator::start(env.client.clone(), args(&argv));
    let first = settled(&env, None).await.metadata.name.unwrap();
    Fleet {
        env,
        attacker,
        hostile,
        metrics_port,
        first,
        _configurator: configurator,
        _agents: agents,
        _attacker_agent: attacker_agent,
    }
}

/// The newest revision once it (a revision other than `after`) is Complete or Failed and no node is in
/// flight any more (rollbacks done).
async fn settled(env: &Env, after: Option<&str>) -> NetworkConfigRevision {
    settled_but(env, after, &[]).await
}

/// [`settled`], whatever the agents of `ignored` report.
async fn settled_but(env: &Env, after: Option<&str>, ignored: &[&str]) -> NetworkConfigRevision {
    eventually(T, "the newest revision settled", || async {
        let revs = revisions(&env.client).await;
        let Some(newest) = revs.last().filter(|r| r.metadata.name.as_deref() != after) else {
            return Err("no new revision".to_string());
        };
        let busy: Vec<String> = configs(&env.client)
            .await
            .into_iter()
            .filter(|(n, c)| in_flight(c) && !ignored.contains(&n.as_str()))
            .map(|(n, _)| n)
            .collect();
        let p = phase(newest);
        match RevisionPhase::parse(Some(&p)) {
            Some(RevisionPhase::Complete | RevisionPhase::Failed) if busy.is_empty() => {
                Ok(newest.clone())
            }
            _ => Err(format!("{}: {p}, in flight {busy:?}", newest.name_any())),
        }
    })
    .await
}

/// An input change (a new MTU on a segment every node has), and the revision it makes once settled.
async fn roll(f: &Fleet, mtu: u32) -> NetworkConfigRevision {
    let before = revisions(&f.env.client).await.last().map(|r| r.name_any());
    change_inputs(&f.env.client, mtu).await;
    settled(&f.env, before.as_deref()).await
}

/// Nodes whose agent reports `Provisioned` for `rev` in their spec.
async fn on(f: &Fleet, rev: &str) -> Vec<String> {
    configs(&f.env.client)
        .await
        .into_iter()
        .filter(|(_, c)| {
            let st = c.status.clone().unwrap_or_default();
            c.spec.revision == rev
                && st.observed_revision.as_deref() == Some(rev)
                && st.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
        })
        .map(|(n, _)| n)
        .collect()
}

fn failed(r: &NetworkConfigRevision) -> Vec<(String, bool)> {
    let st = r.status.clone().unwrap_or_default();
    st.failed_nodes
        .into_iter()
        .map(|f| (f.node, f.quarantined))
        .collect()
}

async fn node_config(f: &Fleet) -> NodeNetworkConfig {
    Api::<NodeNetworkConfig>::all(f.env.client.clone())
        .get(HOSTILE)
        .await
        .unwrap()
}

async fn quarantined_gauge(f: &Fleet) -> String {
    let (_, body) = http_get(f.metrics_port, "/metrics").await;
    body.lines()
        .find(|l| l.starts_with("netwave_quarantined_nodes "))
        .unwrap_or_default()
        .to_string()
}

/// The default: node-a's compromised agent fails every revision it is given, each fails for the whole
/// fleet (maxFailures 1) and rolls back; no other node keeps any change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quarantine_one_compromised_agent_vetoes_every_revision() {
    let f = fleet(&[]).await;
    f.hostile.store(true, Ordering::SeqCst);
    for mtu in [1400, 1401, 1402] {
        let r = roll(&f, mtu).await;
        let message = r
            .status
            .clone()
            .unwrap_or_default()
            .message
            .unwrap_or_default();
        eprintln!("{}: {} ({message})", r.name_any(), phase(&r));
        assert_eq!(phase(&r), RevisionPhase::Failed.as_str(), "{message}");
        assert_eq!(failed(&r), [(HOSTILE.to_string(), false)]);
        assert!(on(&f, &r.name_any()).await.is_empty(), "no node keeps it");
    }
    assert_eq!(
        on(&f, &f.first).await.len(),
        NODES.len(),
        "vetoed: all on the first"
    );
    assert!(
        node_config(&f)
            .await
            .annotations()
            .get(QUARANTINED_ANNOTATION)
            .is_none()
    );
}

/// With `--quarantine-after 2`: the first failure (node-a is first in order, no other node has the
/// revision) counts as always; node-a then goes last, fails two revisions the others provisioned and
/// is quarantined by the second, which completes without it; the next revision reaches every other
/// node, node-a stays on its last good config. Reported on its NodeNetworkConfig (annotation,
/// condition), by an Event and the gauge. The attacker cannot lift it, an admin can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_agent_fails_every_revision_is_quarantined_and_the_fleet_moves_on() {
    let f = fleet(&["--quarantine-after", "2"]).await;
    f.hostile.store(true, Ordering::SeqCst);
    let r2 = roll(&f, 1400).await;
    assert_eq!(
        (phase(&r2).as_str(), failed(&r2)),
        (
            RevisionPhase::Failed.as_str(),
            vec![(HOSTILE.into(), false)]
        )
    );
    let r3 = roll(&f, 1401).await;
    assert_eq!(
        (phase(&r3).as_str(), failed(&r3)),
        (
            RevisionPhase::Failed.as_str(),
            vec![(HOSTILE.into(), false)]
        )
    );
    let streak = node_config(&f)
        .await
        .annotations()
        .get(netwave_api::FAILURE_STREAK_ANNOTATION)
        .cloned();
    assert_eq!(
        streak,
        Some(format!("{}@{}", r3.name_any(), r3.spec.sequence)),
        "r2 was no evidence (nobody else had it); r3 was"
    );

    let r4 = roll(&f, 1402).await;
    assert_eq!(phase(&r4), RevisionPhase::Complete.as_str());
    assert_eq!(
        failed(&r4),
        [(HOSTILE.to_string(), true)],
        "its failure does not count"
    );
    assert_eq!(on(&f, &r4.name_any()).await.len(), NODES.len() - 1);
    let nnc = node_config(&f).await;
    assert_eq!(nnc.spec.revision, f.first, "back on its last good config");
    let note = nnc
        .annotations()
        .get(QUARANTINED_ANNOTATION)
        .cloned()
        .unwrap();
    assert!(
        note.contains(&format!(
            "failed {}, {} in a row",
            r3.name_any(),
            r4.name_any()
        )),
        "{note}"
    );
    let condition = eventually(T, "the Quarantined condition", || async {
        let st = node_config(&f).await.status.unwrap_or_default();
        match st
            .conditions
            .iter()
            .find(|c| c.type_ == QUARANTINED_CONDITION)
        {
            Some(c) if c.status == ConditionStatus::True.as_str() => Ok(c.message.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eprintln!("Quarantined: {condition}");
    assert!(
        condition.contains("kubectl annotate nnc node-a netwave.dev/quarantined-"),
        "{condition}"
    );
    // Events go out after the writes of the same pass.
    let events = eventually(T, "a NodeQuarantined Event", || async {
        let notes = event_notes(&f.env.client, HOSTILE, "NodeQuarantined").await;
        if notes.is_empty() {
            Err("none".to_string())
        } else {
            Ok(notes)
        }
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    eprintln!("NodeQuarantined: {}", events[0]);
    eventually(T, "the gauge", || async {
        match quarantined_gauge(&f).await.as_str() {
            "netwave_quarantined_nodes 1" => Ok(()),
            other => Err(other.to_string()),
        }
    })
    .await;

    // The next revision reaches every other node; node-a keeps its last good config.
    let r5 = roll(&f, 1403).await;
    assert_eq!(phase(&r5), RevisionPhase::Complete.as_str());
    assert_eq!(on(&f, &r5.name_any()).await.len(), NODES.len() - 1);
    assert!(failed(&r5).is_empty(), "node-a was not given it");
    assert_eq!(node_config(&f).await.spec.revision, f.first);

    // The attacker cannot lift the quarantine: its token may not write the NodeNetworkConfig itself.
    let nncs = Api::<NodeNetworkConfig>::all(f.attacker.clone());
    let lift = json!({"metadata": {"annotations": {QUARANTINED_ANNOTATION: null}}});
    let err = nncs
        .patch(HOSTILE, &PatchParams::default(), &Patch::Merge(&lift))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(ae) if ae.code == 403),
        "{err}"
    );
    // It may write its status, so it can delete the condition; the configurator puts it back.
    nncs.patch_status(
        HOSTILE,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"conditions": null}})),
    )
    .await
    .unwrap();
    eventually(T, "the condition back", || async {
        let st = node_config(&f).await.status.unwrap_or_default();
        if st
            .conditions
            .iter()
            .any(|c| c.type_ == QUARANTINED_CONDITION)
        {
            Ok(())
        } else {
            Err(format!("{:?}", st.conditions))
        }
    })
    .await;

    // An admin releases it.
    kubectl(
        &f.env,
        &[
            "annotate",
            "nnc",
            HOSTILE,
            &format!("{QUARANTINED_ANNOTATION}-"),
        ],
    );
    eventually(T, "released", || async {
        let st = node_config(&f).await.status.unwrap_or_default();
        let gauge = quarantined_gauge(&f).await;
        if !st
            .conditions
            .iter()
            .any(|c| c.type_ == QUARANTINED_CONDITION)
            && gauge == "netwave_quarantined_nodes 0"
        {
            Ok(())
        } else {
            Err(format!("{:?}, {gauge}", st.conditions))
        }
    })
    .await;
}

/// #48 item 2: node-c's and node-d's agents (each with its own pod-bound token) collude. Each lists
/// the NodeNetworkConfigs its token may read, and as soon as another node's spec names a revision newer
/// than its own, reports `Invalid` for that revision on its own status: a verdict on a config it was
/// never given. (They sort last, so the first wave shows them the name; honest agents take a second
/// per apply, so the liars, polling every 50 ms, are ahead of the waves.) Before #48 the first such
/// report failed every revision (maxFailures 1).
///
/// Now each report is a protocol violation: ignored, flagged on the revision, an Event and a counter;
/// every revision completes on node-a and node-b; the liars keep their config and are not given the
/// revision; with `--quarantine-after 2` both are quarantined by the second revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_reporting_on_revisions_they_were_not_given_veto_nothing() {
    const LIARS: [&str; 2] = ["node-c", "node-d"];
    let env = env().await;
    let mut tokens = Vec::new();
    for liar in LIARS {
        tokens.push(agent_on(&env, liar).await);
    }
    for n in NODES {
        let pool = [("node-restriction.kubernetes.io/netwave-pool", "compute")];
        create_node(&env.client, &node(n, &pool)).await;
    }
    let honest: Behaviour = Arc::new(|node: &str, _: &str| {
        if LIARS.contains(&node) {
            Answer::Silent
        } else {
            Answer::Provisioned
        }
    });
    let _agents = spawn_agents(env.client.clone(), honest, Duration::from_secs(1));
    // Until the first revision completes the liars answer as agents do (Provisioned), so they have a
    // config to keep; then Invalid on anything they are given (which, if it happens, fails a revision
    // and this test).
    let lying = Arc::new(AtomicBool::new(false));
    let mut _liars = Vec::new();
    for (me, client) in LIARS.iter().zip(tokens) {
        let flag = lying.clone();
        let honest_until = Arc::new(move |nnc: &NodeNetworkConfig| {
            if nnc.name_any() != *me {
                Answer::Silent
            } else if flag.load(Ordering::SeqCst) {
                Answer::Invalid {
                    reason: Reason::ApplyFailed,
                    message: "route add failed: Invalid argument".into(),
                }
            } else {
                Answer::Provisioned
            }
        });
        let delay = Duration::from_millis(50);
        _liars.push(Task(netwave_agent::sim::spawn(
            client.clone(),
            honest_until,
            delay,
        )));
        _liars.push(Task(tokio::spawn(lie(client, me, lying.clone()))));
    }
    apply_samples(&env.client).await;
    let (argv, metrics_port) = args_with_metrics(&["--quarantine-after", "2"]);
    let _configurator = Configurator::start(env.client.clone(), argv);
    let first = settled(&env, None).await.name_any();
    lying.store(true, Ordering::SeqCst);

    let mut rolled = Vec::new();
    for (k, mtu) in [1400, 1401, 1402].into_iter().enumerate() {
        let before = revisions(&env.client).await.last().map(|r| r.name_any());
        change_inputs(&env.client, mtu).await;
        let r = settled_but(&env, before.as_deref(), &LIARS).await;
        let name = r.name_any();
        eprintln!("{name}: {} {:?}", phase(&r), failed(&r));
        assert_eq!(phase(&r), RevisionPhase::Complete.as_str(), "{name}");
        let on_it = configs(&env.client).await.into_iter().filter(|(_, c)| {
            let st = c.status.clone().unwrap_or_default();
            c.spec.revision == name && st.observed_revision.as_deref() == Some(name.as_str())
        });
        let on_it: Vec<String> = on_it.map(|(n, _)| n).collect();
        assert_eq!(on_it, ["node-a", "node-b"], "{name}");
        let st = r.status.clone().unwrap_or_default();
        let flagged: Vec<(&str, &str, bool)> = (st.failed_nodes.iter())
            .map(|f| (f.node.as_str(), f.reason.as_str(), f.quarantined))
            .collect();
        if k < 2 {
            // Once quarantined (by the second), they are skipped and recorded no more.
            let v = netwave_api::vocab::node_reasons::PROTOCOL_VIOLATION;
            assert_eq!(
                flagged,
                [("node-c", v, true), ("node-d", v, true)],
                "{name}"
            );
        }
        rolled.push(name);
    }
    for liar in LIARS {
        let nnc = Api::<NodeNetworkConfig>::all(env.client.clone())
            .get(liar)
            .await
            .unwrap();
        assert_eq!(nnc.spec.revision, first, "{liar} keeps its config");
        let note = nnc.annotations().get(QUARANTINED_ANNOTATION).cloned();
        let note = note.unwrap_or_else(|| panic!("{liar} quarantined"));
        assert!(
            note.contains(&format!("failed {}, {} in a row", rolled[0], rolled[1])),
            "{note}"
        );
        // Events go out after the writes of the same pass.
        eventually(T, "a ProtocolViolation Event per revision", || async {
            match event_count(&env.client, liar, "ProtocolViolation").await {
                n if n >= rolled.len() as i32 => Ok(()),
                n => Err(format!("{liar}: {n}")),
            }
        })
        .await;
        let events = event_notes(&env.client, liar, "ProtocolViolation").await;
        eprintln!("ProtocolViolation: {}", events[0]);
    }
    let counter = metric(metrics_port, "netwave_protocol_violations_total").await;
    assert!(counter.is_some_and(|v| v >= 4.0), "{counter:?}");
}

/// One liar's lies, as described above, with `client` holding its pod-bound token (an agent from the
/// agent's own code answers for it until `lying` is set).
async fn lie(client: Client, me: &'static str, lying: Arc<AtomicBool>) {
    let nncs = Api::<NodeNetworkConfig>::all(client);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Ok(list) = nncs.list(&Default::default()).await else {
            continue;
        };
        let Some(mine) = list.items.iter().find(|c| c.name_any() == me) else {
            continue;
        };
        let st = mine.status.clone().unwrap_or_default();
        let new = (list.items.iter())
            .filter(|c| c.spec.sequence > mine.spec.sequence)
            .max_by_key(|c| c.spec.sequence)
            .map(|c| (c.spec.revision.clone(), c.spec.retry));
        let Some((revision, retry)) = new.filter(|_| lying.load(Ordering::SeqCst)) else {
            continue;
        };
        if st.phase.as_deref() == Some("Invalid")
            && st.observed_revision.as_deref() == Some(revision.as_str())
        {
            continue;
        }
        let status = json!({
            "phase": "Invalid", "observedRevision": revision, "observedRetry": retry,
            "observedConfigHash": null, "reason": "ApplyFailed",
            "message": "route add failed: Invalid argument",
        });
        let patch = Patch::Merge(json!({ "status": status }));
        if let Err(e) = nncs.patch_status(me, &PatchParams::default(), &patch).await {
            eprintln!("{me}'s lie refused: {e}");
        }
    }
}
