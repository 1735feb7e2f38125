//! The underlay through the gate (#47): an `Underlay` object is an input like a VRF. Creating one cuts a
//! revision that rolls onto the nodes it selects in waves (the budget held), each node's config carries
//! it, and `kubectl get ul` says where it is; a second Underlay on the same nodes is refused before any
//! node is touched, naming both.

mod common;

use std::time::Duration;

use common::*;
use kube::api::{Api, PostParams};
use netwave_api::vocab::{ConditionStatus, RevisionPhase, accepted_reasons};
use netwave_api::{Underlay, UnderlayConfig};
use serde_json::json;

const T: Duration = Duration::from_secs(90);

fn underlay(name: &str, asn: u32, neighbor: &str) -> Underlay {
    serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "Underlay",
        "metadata": {"name": name},
        "spec": {
            "asn": asn,
            "neighbors": [{"address": neighbor, "remoteAs": "internal"}],
            "nodeSelector": {"matchLabels": {"node-restriction.kubernetes.io/netwave-pool": "compute"}},
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underlay_rolls_out_in_waves_and_a_second_one_on_the_same_nodes_is_refused() {
    let env = env().await;
    let names = node_names(4);
    add_nodes(&env.client, &names).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(300));
    apply_samples(&env.client).await;
    let _c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "1"]));
    newest_completes(&env.client, 1, T).await;
    let before = configs(&env.client).await;
    assert!(before.values().all(|c| c.spec.config.underlay.is_none()));

    let history = History::record(&env.client);
    let underlays: Api<Underlay> = Api::all(env.client.clone());
    underlays
        .create(
            &PostParams::default(),
            &underlay("fabric", 65010, "198.18.0.254"),
        )
        .await
        .unwrap();
    newest_completes(&env.client, 2, T).await;
    let want = UnderlayConfig {
        name: "fabric".into(),
        asn: 65010,
        neighbors: vec![netwave_api::UnderlayNeighborSpec {
            address: Some("198.18.0.254".into()),
            interface: None,
            remote_as: "internal".into(),
        }],
        timers: None,
    };
    let after = configs(&env.client).await;
    for (name, c) in &after {
        assert_eq!(c.spec.config.underlay.as_ref(), Some(&want), "{name}");
        // Nothing else of the node's config changed.
        let mut rest = c.spec.config.clone();
        rest.underlay = None;
        assert_eq!(rest, before[name].spec.config, "{name}");
    }
    let max = history.max_in_flight();
    assert!(max <= 1, "{max} nodes took the new underlay at once");
    eventually(T, "kubectl get ul shows where it is", || async {
        let o = env
            .cp()
            .kubectl()
            .args(["get", "ul", "fabric"])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let row = out.lines().nth(1).unwrap_or_default().to_string();
        let cells: Vec<&str> = row.split_whitespace().collect();
        match cells.as_slice() {
            ["fabric", "65010", "True", "4", ..] => Ok(()),
            _ => Err(out),
        }
    })
    .await;

    // A second Underlay on the same nodes: refused naming both, no node touched.
    underlays
        .create(
            &PostParams::default(),
            &underlay("fabric-b", 65020, "198.18.0.253"),
        )
        .await
        .unwrap();
    let message = eventually(T, "the second underlay refused", || async {
        let o = underlays.get("fabric-b").await.unwrap();
        match o.status.unwrap_or_default().accepted() {
            Some(c)
                if c.status == ConditionStatus::False.as_str()
                    && c.reason == accepted_reasons::INVALID =>
            {
                Ok(c.message.clone())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        message.contains("fabric") && message.contains("select the same nodes"),
        "{message}"
    );
    let revs = revisions(&env.client).await;
    assert!(
        (revs.iter()).all(|r| r.status.as_ref().and_then(|s| s.phase.as_deref())
            != Some(RevisionPhase::Progressing.as_str())),
        "no rollout started"
    );
    let now = configs(&env.client).await;
    for (name, c) in &now {
        assert_eq!(c.spec, after[name].spec, "{name} untouched");
    }
}
