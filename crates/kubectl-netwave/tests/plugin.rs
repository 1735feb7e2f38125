//! `kubectl netwave` against the real kube-apiserver: objects are written the way the configurator and
//! agents write them, and the tests assert what an admin reads and what ends up on the cluster.

mod common;

use common::*;
use kubectl_netwave::Exit;
use serde_json::{Value, json};

/// rev 1 Complete; rev 2 rolling out on 5 nodes: 3 updated, node-3 failed (rolled back), node-4
/// applying. Returns the two revision names.
async fn mid_rollout(client: &kube::Client) -> (String, String) {
    for i in 0..5 {
        create_node(client, &format!("node-{i}"), json!({"rack": "a"})).await;
    }
    let good = create_revision(
        client,
        &inputs(9000, false),
        1,
        json!({"phase": "Complete", "total": 5, "updated": 5}),
    )
    .await;
    let new = create_revision(
        client,
        &inputs(1500, false),
        2,
        json!({
            "phase": "Progressing", "total": 5, "updated": 3, "inProgress": 1, "failed": 1,
            "failedNodes": [{"node": "node-3", "reason": "HealthCheckFailed",
                             "message": "HealthCheckFailed: icmp 198.18.0.1 unreachable after apply"}],
            "message": "waiting for budget: 1 node(s) in flight, maxUnavailable 1",
            "startedAt": "2026-11-23T10:00:00Z",
        }),
    )
    .await;
    for (i, at) in ["10:00:00", "10:00:00", "10:00:10"].iter().enumerate() {
        create_config(
            client,
            &format!("node-{i}"),
            &new,
            2,
            &format!("2026-11-23T{at}.000Z"),
            json!({"phase": "Provisioned", "observedRevision": new}),
        )
        .await;
    }
    create_config(
        client,
        "node-3",
        &good,
        1,
        "2026-11-23T10:00:20.000Z",
        json!({"phase": "Invalid", "observedRevision": new, "reason": "HealthCheckFailed",
               "message": "HealthCheckFailed: icmp 198.18.0.1 unreachable after apply",
               "lastGoodRevision": good}),
    )
    .await;
    create_config(
        client,
        "node-4",
        &new,
        2,
        "2026-11-23T10:00:20.000Z",
        json!({"phase": "Provisioning", "observedRevision": new}),
    )
    .await;
    (good, new)
}

#[tokio::test]
async fn status_shows_progress_failures_and_who_paused() {
    let env = env().await;
    let c = &env.client;
    let (good, new) = mid_rollout(c).await;

    let (exit, out) = kn(c, &["status"]).await;
    assert_eq!(exit, Exit::Success);
    println!("{out}");
    assert!(
        out.contains(&format!(
            "revision {new} (seq 2)  phase Progressing  wave 3"
        )),
        "{out}"
    );
    assert!(out.contains("3/5 updated  1 in flight  1 failed"), "{out}");
    assert!(out.contains(&format!("last good {good}")), "{out}");
    assert!(
        out.contains("waiting on: waiting for budget: 1 node(s) in flight, maxUnavailable 1"),
        "{out}"
    );
    assert!(
        out.contains("node-3  HealthCheckFailed: icmp 198.18.0.1 unreachable after apply"),
        "the failed node with its agent's reason: {out}"
    );
    assert!(out.contains(&format!("(restored {good})")), "{out}");
    assert!(out.contains("node-4  applying  Provisioning"), "{out}");
    assert!(!out.contains("PAUSED"), "{out}");

    // By sequence number, and the older revision.
    let (_, out1) = kn(c, &["status", "1"]).await;
    assert!(
        out1.contains(&format!("revision {good} (seq 1)  phase Complete")),
        "{out1}"
    );

    // pause: spec.paused, and status names who paused.
    let (_, said) = kn(c, &["pause"]).await;
    assert!(said.contains(&format!("paused {new} (seq 2)")), "{said}");
    assert!(revision(c, &new).await.spec.paused);
    let (_, out) = kn(c, &["status"]).await;
    assert!(out.contains("PAUSED by kubectl-netwave at "), "{out}");
    let (_, again) = kn(c, &["pause", "2"]).await;
    assert!(
        again.contains("already paused (by kubectl-netwave at "),
        "{again}"
    );
    // The configurator records who paused in status; the view shows that when present.
    set_revision_status(
        c,
        &new,
        json!({"pausedBy": "kubectl-patch at 2026-11-23T10:01:00Z"}),
    )
    .await;
    let (_, out) = kn(c, &["status"]).await;
    assert!(
        out.contains("PAUSED by kubectl-patch at 2026-11-23T10:01:00Z"),
        "{out}"
    );
    let (_, said) = kn(c, &["resume"]).await;
    assert!(said.contains(&format!("resumed {new}")), "{said}");
    assert!(!revision(c, &new).await.spec.paused);

    // -o json carries the same view.
    let (_, json_out) = kn(c, &["status", "-o", "json"]).await;
    let v: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(v["revision"], new.as_str());
    assert_eq!(v["updated"], 3);
    assert_eq!(v["failedNodes"][0]["node"], "node-3");
    assert_eq!(v["wave"], 3);
    let (_, yaml_out) = kn(c, &["status", "-o", "yaml"]).await;
    assert!(yaml_out.contains("updated: 3"), "{yaml_out}");

    // Clear errors.
    let e = kn_err(c, &["status", "rev-abc"]).await;
    assert_eq!(
        e,
        "revision rev-abc not found; `kubectl netwave history` lists them"
    );
    let e = kn_err(c, &["retry"]).await;
    assert_eq!(e, "no revision has failed: nothing to retry");
}

#[tokio::test]
async fn history_lists_revisions_with_markers_in_every_format() {
    let env = env().await;
    let c = &env.client;
    let (good, new) = mid_rollout(c).await;
    let failed = create_revision(
        c,
        &inputs(1400, true),
        3,
        json!({"phase": "Failed", "total": 5, "failed": 1, "observedRetry": 0}),
    )
    .await;

    let (_, out) = kn(c, &["history"]).await;
    println!("{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("SEQ"), "{out}");
    assert!(
        lines[1].starts_with("1") && lines[1].contains(&good),
        "oldest first: {out}"
    );
    assert!(
        lines[1].contains("Complete") && lines[1].ends_with("<- last good"),
        "{out}"
    );
    assert!(
        lines[2].contains(&new) && lines[2].contains("3/5") && lines[2].ends_with("<- target"),
        "{out}"
    );
    assert!(
        lines[3].contains(&failed) && lines[3].contains("Failed"),
        "{out}"
    );
    assert!(lines[3].contains("1 vrf, 1 l2, 1 rt"), "{out}");

    let (_, j) = kn(c, &["history", "-o", "json"]).await;
    let rows: Vec<Value> = serde_json::from_str(&j).unwrap();
    let flags: Vec<(u64, bool, bool)> = rows
        .iter()
        .map(|r| {
            (
                r["sequence"].as_u64().unwrap(),
                r["target"].as_bool().unwrap(),
                r["lastGood"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        flags,
        vec![(1, false, true), (2, true, false), (3, false, false)]
    );
    let (_, y) = kn(c, &["history", "-o", "yaml"]).await;
    assert!(
        y.contains(&format!("name: {failed}")) && y.contains("phase: Failed"),
        "{y}"
    );

    // retry: the newest failed revision's spec.retry goes up by one.
    let (_, said) = kn(c, &["retry"]).await;
    assert!(
        said.contains(&format!("retrying {failed} (seq 3): spec.retry 0 → 1")),
        "{said}"
    );
    assert_eq!(revision(c, &failed).await.spec.retry, 1);
    let e = kn_err(c, &["retry", &new]).await;
    assert!(
        e.contains(&format!(
            "{new} is Progressing, not Failed: nothing to retry"
        )),
        "{e}"
    );
}
