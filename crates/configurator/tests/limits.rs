//! DESIGN.md §6, "Sizes are validated before anything is written", on the real kube-apiserver + etcd
//! with etcd's default request limit (`--max-request-bytes` 1.5 MiB): inputs that fold into more than
//! one object can hold are refused with the size, the limit and the largest objects named, instead of a
//! revision whose inputs the API server refuses forever; once the admin shrinks them, the next revision
//! rolls out.

mod common;

use netwave_api::vocab::accepted_reasons;
use netwave_api::vocab::{ConditionStatus, RevisionPhase};
use std::time::Duration;

use common::*;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use netwave_api::{NetworkConfigInputs, RoutingTable};
use serde_json::json;

const T: Duration = Duration::from_secs(90);

/// A RoutingTable of `routes` blackhole routes to distinct IPv6 /64s: about 72 bytes a route, so 9,000
/// routes make a 650 KB object (one object fits etcd; three folded together, 1.85 MB, do not).
fn big_table(name: &str, table_id: u32, routes: usize) -> RoutingTable {
    let routes: Vec<serde_json::Value> = (0..routes)
        .map(|i| {
            json!({"prefix": format!("fd00:{table_id:x}:{:x}:{:x}::/64", i / 65536, i % 65536),
                   "type": "blackhole", "metric": 4_000_000_000u32 + i as u32})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": name},
        "spec": {"tableId": table_id, "routes": routes},
    }))
    .unwrap()
}

/// Three routing tables of 8,000 to 9,000 routes each fold into about 1.85 MB, more than etcd takes in one
/// request: no revision is cut (the nodes stay on the last good one, no NetworkConfigInputs is written),
/// and every input's `Accepted` says how big, the limit, and the three largest objects; an Event on the
/// largest says it once. Deleting two of them lets the next revision through to every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_too_large_for_one_object_are_refused_before_any_write() {
    let env = env().await;
    let nodes = node_names(2);
    add_nodes(&env.client, &nodes).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(100));
    apply_samples(&env.client).await;
    // The three tables are created one by one, 650 KB each: a settle window longer than that makes them
    // one change instead of a revision per table.
    let c = Configurator::start(
        env.client.clone(),
        args(&["--max-unavailable", "2", "--input-settle", "5s"]),
    );
    let first = eventually(T, "the samples rolled out", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => {
                Ok(r.metadata.name.clone().unwrap())
            }
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;

    let tables: Api<RoutingTable> = Api::all(env.client.clone());
    for (i, name) in ["big-1", "big-2", "big-3"].iter().enumerate() {
        // Different sizes, so the order of the largest is known.
        let t = big_table(name, 1000 + i as u32, 9_000 - 500 * i);
        tables.create(&PostParams::default(), &t).await.unwrap();
    }
    let message = eventually(T, "big-3 not accepted for the size", || async {
        let st = tables
            .get("big-3")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        match st.accepted() {
            Some(c)
                if c.status == ConditionStatus::False.as_str() && c.message.contains("limit") =>
            {
                Ok(c.message.clone())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eprintln!("big-3 Accepted: {message}");
    for want in [
        "1048576 bytes",
        "RoutingTable/big-1",
        "RoutingTable/big-2",
        "RoutingTable/big-3",
        "no revision is cut",
    ] {
        assert!(message.contains(want), "{want:?} in {message}");
    }
    let big1 = message.find("RoutingTable/big-1").unwrap();
    assert!(
        big1 < message.find("RoutingTable/big-3").unwrap(),
        "largest first: {message}"
    );
    // A sample routing table, fine itself, says the same: no object is left reading Accepted. (Each
    // object's status is its own write, so it may land after big-3's.)
    let sample = tables
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|t| !t.metadata.name.as_deref().unwrap().starts_with("big-"))
        .unwrap()
        .metadata
        .name
        .unwrap();
    eventually(T, "the sample table not accepted", || async {
        let st = tables
            .get(&sample)
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        match st.accepted() {
            Some(c)
                if c.status == ConditionStatus::False.as_str()
                    && c.reason == accepted_reasons::REVISION_INVALID =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // The reconcile that wrote the condition decided not to cut; nothing was written for a revision.
    let revs = revisions(&env.client).await;
    assert_eq!(
        revs.len(),
        1,
        "no revision cut: {:?}",
        revs.iter().map(phase).collect::<Vec<_>>()
    );
    let inputs = Api::<NetworkConfigInputs>::all(env.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(inputs.len(), 1, "no NetworkConfigInputs written");
    for (node, nnc) in configs(&env.client).await {
        assert_eq!(
            nnc.spec.revision, first,
            "{node} stays on the last good revision"
        );
    }
    let notes = eventually(T, "an InputsTooLarge Event", || async {
        let notes = event_notes(&env.client, "big-1", "InputsTooLarge").await;
        if notes.is_empty() {
            Err("none".to_string())
        } else {
            Ok(notes)
        }
    })
    .await;
    assert_eq!(notes.len(), 1, "said once: {notes:?}");

    // The admin shrinks the inputs: the next revision goes through.
    for name in ["big-1", "big-2"] {
        tables.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let second = eventually(T, "a new revision complete on every node", || async {
        let revs = revisions(&env.client).await;
        let Some(last) = revs
            .last()
            .filter(|r| r.metadata.name.as_deref() != Some(&first))
        else {
            return Err("no new revision".into());
        };
        let name = last.metadata.name.clone().unwrap();
        let on_it = configs(&env.client)
            .await
            .values()
            .filter(|c| c.spec.revision == name)
            .count();
        if phase(last) == RevisionPhase::Complete.as_str() && on_it == nodes.len() {
            Ok(name)
        } else {
            Err(format!("{name}: {} on {on_it} node(s)", phase(last)))
        }
    })
    .await;
    eventually(T, "big-3 accepted", || async {
        let st = tables
            .get("big-3")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        match st.accepted() {
            Some(c)
                if c.status == ConditionStatus::True.as_str()
                    && st.revision.as_deref() == Some(&second) =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    c.stop().await;
}
