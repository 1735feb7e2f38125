//! `kubectl netwave` against the real kube-apiserver: objects are written the way the configurator and
//! agents write them, and the tests assert what an admin reads and what ends up on the cluster.

mod common;

use common::*;
use kube::api::{Api, Patch, PatchParams};
use kubectl_netwave::Exit;
use netwave_api::vocab::{NodePhase, NodeReason, RevisionPhase};
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig, RoutingTable};
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
        json!({"phase": RevisionPhase::Complete.as_str(), "total": 5, "updated": 5}),
    )
    .await;
    let new = create_revision(
        client,
        &inputs(1500, false),
        2,
        json!({
            "phase": RevisionPhase::Progressing.as_str(), "total": 5, "updated": 3, "inProgress": 1, "failed": 1,
            "failedNodes": [{"node": "node-3", "reason": NodeReason::HealthCheckFailed.as_str(),
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
            json!({"phase": NodePhase::Provisioned.as_str(), "observedRevision": new}),
        )
        .await;
    }
    create_config(
        client,
        "node-3",
        &good,
        1,
        "2026-11-23T10:00:20.000Z",
        json!({"phase": NodePhase::Invalid.as_str(), "observedRevision": new, "reason": NodeReason::HealthCheckFailed.as_str(),
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
        json!({"phase": NodePhase::Provisioning.as_str(), "observedRevision": new}),
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
        json!({"phase": RevisionPhase::Failed.as_str(), "total": 5, "failed": 1, "observedRetry": 0}),
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
        lines[1].contains(RevisionPhase::Complete.as_str()) && lines[1].ends_with("<- last good"),
        "{out}"
    );
    assert!(
        lines[2].contains(&new) && lines[2].contains("3/5") && lines[2].ends_with("<- target"),
        "{out}"
    );
    assert!(
        lines[3].contains(&failed) && lines[3].contains(RevisionPhase::Failed.as_str()),
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

/// Revision 1 (inputs A) Complete, revision 2 (inputs B: the segment's MTU lowered, a routing table
/// added) rolling out, B on the cluster; nodes 0 and 1 in rack a (they carry the segment), node 2 not.
async fn two_revisions(client: &kube::Client) -> (String, String) {
    create_node(client, "node-0", json!({"rack": "a"})).await;
    create_node(client, "node-1", json!({"rack": "a"})).await;
    create_node(client, "node-2", json!({"rack": "b"})).await;
    let a = create_revision(
        client,
        &inputs(9000, false),
        1,
        json!({"phase": RevisionPhase::Complete.as_str()}),
    )
    .await;
    let b = create_revision(
        client,
        &inputs(1500, true),
        2,
        json!({"phase": RevisionPhase::Progressing.as_str()}),
    )
    .await;
    create_inputs(client, &inputs(1500, true)).await;
    (a, b)
}

#[tokio::test]
async fn diff_shows_which_nodes_change_and_how() {
    let env = env().await;
    let c = &env.client;
    let (a, b) = two_revisions(c).await;
    let (_, out) = kn(c, &["diff", "1", &b]).await;
    println!("{out}");
    assert!(
        out.starts_with(&format!(
            "{a} (seq 1) → {b} (seq 2), rendered for the 3 current Nodes"
        )),
        "{out}"
    );
    assert!(
        out.contains("3 of 3 nodes change (2 distinct changes):"),
        "{out}"
    );
    let rack_a = out.find("  2 nodes: node-0, node-1\n").expect(&out);
    let rack_b = out.find("  1 node: node-2\n").expect(&out);
    assert!(rack_a < rack_b, "most nodes first: {out}");
    assert!(
        out[rack_a..rack_b].contains("    ~ layer2 vlan 100: mtu 9000 → 1500\n"),
        "{out}"
    );
    assert!(
        out[rack_b..].contains("    + route table 300 10.9.0.0/16"),
        "{out}"
    );
    assert!(
        !out[rack_b..].contains("layer2"),
        "node-2 has no segment: {out}"
    );

    let (_, j) = kn(c, &["diff", &a, &b, "-o", "json"]).await;
    let v: Value = serde_json::from_str(&j).unwrap();
    assert_eq!(v["changed"], 3);
    assert_eq!(v["groups"][0]["nodes"], json!(["node-0", "node-1"]));

    let (_, same) = kn(c, &["diff", "2", "2"]).await;
    assert!(
        same.contains("no node's config changes (3 nodes)"),
        "{same}"
    );
    let e = kn_err(c, &["diff", "1", "9"]).await;
    assert_eq!(
        e,
        "revision 9 not found; `kubectl netwave history` lists them"
    );
}

#[tokio::test]
async fn undo_restores_the_inputs_of_a_good_revision() {
    let env = env().await;
    let c = &env.client;
    let (a, b) = two_revisions(c).await;
    // Someone else's edit (another field manager) adds a field revision 1 does not have, and the VRF
    // was deleted: undo must put back exactly revision 1's objects.
    kube::Api::<netwave_api::Layer2NetworkConfiguration>::all(c.clone())
        .patch(
            "vlan100",
            &kube::api::PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..Default::default()
            },
            &kube::api::Patch::Merge(json!({"spec": {"neighSuppression": true}})),
        )
        .await
        .unwrap();
    kube::Api::<netwave_api::VRFRouteConfiguration>::all(c.clone())
        .delete("tenant", &Default::default())
        .await
        .unwrap();
    let before = live_inputs(c).await;

    let (exit, out) = kn(c, &["undo"]).await;
    println!("{out}");
    assert_eq!(exit, Exit::NotConfirmed);
    assert!(
        out.starts_with(&format!("bring back the inputs of {a} (seq 1):\n")),
        "{out}"
    );
    assert!(
        out.contains("  + create VRFRouteConfiguration/tenant\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "  ~ update Layer2NetworkConfiguration/vlan100: mtu 1500 → 9000, neighSuppression true → \
             (none)\n"
        ),
        "{out}"
    );
    assert!(out.contains("  - delete RoutingTable/extra\n"), "{out}");
    assert!(
        out.contains("nothing written: run `kubectl netwave undo --yes` to do this"),
        "{out}"
    );
    assert_eq!(
        live_inputs(c).await,
        before,
        "nothing written without --yes"
    );
    let (exit, out) = kn(c, &["undo", "--to", &a, "--dry-run", "-o", "json"]).await;
    assert_eq!(exit, Exit::Success);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["changes"]["delete"], json!(["RoutingTable/extra"]));
    assert_eq!(live_inputs(c).await, before, "nothing written by a dry run");

    let (exit, out) = kn(c, &["undo", "--yes"]).await;
    assert_eq!(exit, Exit::Success, "{out}");
    assert!(
        out.contains(&format!(
            "done: the configurator makes {a} the target again"
        )),
        "{out}"
    );
    let now = live_inputs(c).await;
    assert_eq!(
        now,
        inputs(9000, false),
        "the cluster holds exactly revision 1's inputs"
    );
    assert_eq!(
        netwave_core::revision::inputs_hash(&now),
        revision(c, &a).await.spec.hash
    );
    let (_, again) = kn(c, &["undo", "--to", "1", "--yes"]).await;
    assert!(
        again.contains("already equal it: nothing to change"),
        "{again}"
    );

    // Back to revision 2 works the same way; a failed revision is refused.
    let (_, _) = kn(c, &["undo", "--to", &b, "--yes"]).await;
    assert_eq!(live_inputs(c).await, inputs(1500, true));
    set_revision_status(
        c,
        &b,
        json!({"phase": RevisionPhase::Failed.as_str(), "observedRetry": 0}),
    )
    .await;
    let e = kn_err(c, &["undo", "--to", "2"]).await;
    assert_eq!(
        e,
        format!(
            "{b} failed: undo brings back good revisions only (`kubectl netwave retry 2` re-arms it)"
        )
    );
}

/// DESIGN.md §6: undo is measured like any change. Going back to the empty first revision removes
/// everything the last good revision has: undo says the configurator will hold it, before and after it
/// writes, by the configurator's own rule.
#[tokio::test]
async fn undo_says_when_the_revision_it_brings_back_will_be_held() {
    let env = env().await;
    let c = &env.client;
    for (i, rack) in ["a", "a", "b"].iter().enumerate() {
        create_node(c, &format!("node-{i}"), json!({ "rack": rack })).await;
    }
    let empty = create_revision(
        c,
        &netwave_api::RevisionInputs::default(),
        1,
        json!({"phase": RevisionPhase::Superseded.as_str()}),
    )
    .await;
    let full = create_revision(
        c,
        &inputs(9000, true),
        2,
        json!({"phase": RevisionPhase::Complete.as_str()}),
    )
    .await;
    create_inputs(c, &inputs(9000, true)).await;

    let (exit, out) = kn(c, &["undo", "--to", "1"]).await;
    println!("{out}");
    assert_eq!(exit, Exit::NotConfirmed);
    let held = format!(
        "held: going back to {empty} removes 3 of the 3 objects the last good revision {full} has \
         (from 3 node(s): 8 of 8 node placements): vrf/tenant, l2/vlan100, rt/extra: the configurator \
         holds it as a destructive change"
    );
    assert!(out.contains(&held), "{out}");
    let (_, json_out) = kn(c, &["undo", "--to", "1", "--dry-run", "-o", "json"]).await;
    let v: Value = serde_json::from_str(&json_out).unwrap();
    assert!(
        v["held"]
            .as_str()
            .is_some_and(|h| h.starts_with("removes 3 of the 3")),
        "{v}"
    );
    // A threshold of 100 still holds removing everything.
    let (_, out) = kn(c, &["undo", "--to", "1", "--destructive-threshold", "100"]).await;
    assert!(out.contains("held: going back to"), "{out}");

    let (exit, out) = kn(c, &["undo", "--to", "1", "--yes"]).await;
    assert_eq!(exit, Exit::Success, "{out}");
    assert!(
        out.contains(&format!(
            "done: the configurator makes {empty} the target again and holds it until an admin \
             resumes it"
        )),
        "{out}"
    );
    assert_eq!(live_inputs(c).await, netwave_api::RevisionInputs::default());

    // Back to the last good revision itself: nothing held.
    let (_, out) = kn(c, &["undo", "--to", "2"]).await;
    assert!(!out.contains("held:"), "{out}");
}

/// Writes `files` (relative path → text) under a fresh directory.
fn manifest_dir(files: &[(&str, &str)]) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kubectl-netwave-plan-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

const VRF_YAML: &str = "\
apiVersion: netwave.dev/v1alpha1
kind: VRFRouteConfiguration
metadata: {name: tenant}
spec: {vrf: tenant, vni: 2000, routeTarget: '64512:2000', tableId: 200, seq: 1}
";

fn l2_yaml(mtu: u32) -> String {
    format!(
        "apiVersion: netwave.dev/v1alpha1
kind: Layer2NetworkConfiguration
metadata: {{name: vlan100}}
spec:
  id: 100
  vni: 1000100
  mtu: {mtu}
  vrf: tenant
  anycastGateways: [10.250.0.1/24]
  anycastMac: 02:00:5e:00:01:01
  nodeSelector: {{matchLabels: {{rack: a}}}}
"
    )
}

#[tokio::test]
async fn plan_shows_changes_validation_and_waves_and_writes_nothing() {
    let env = env().await;
    let c = &env.client;
    for i in 0..10 {
        let rack = if i < 6 { "a" } else { "b" };
        create_node(c, &format!("node-{i}"), json!({"rack": rack})).await;
    }
    let a = create_revision(
        c,
        &inputs(9000, false),
        1,
        json!({"phase": RevisionPhase::Complete.as_str()}),
    )
    .await;
    create_inputs(c, &inputs(9000, false)).await;
    let before = live_inputs(c).await;

    // The segment's MTU lowered: the 6 rack-a nodes change, 2 at a time; rack b moves for free.
    let dir = manifest_dir(&[("vrf.yaml", VRF_YAML), ("segments/l2.yml", &l2_yaml(1500))]);
    let d = dir.to_str().unwrap();
    let (_, out) = kn(c, &["plan", "-f", d, "--max-unavailable", "2"]).await;
    println!("{out}");
    assert!(
        out.contains(&format!("(10 nodes), against the current target {a}")),
        "{out}"
    );
    assert!(
        out.contains("  ~ update Layer2NetworkConfiguration/vlan100: mtu 9000 → 1500\n"),
        "{out}"
    );
    assert!(out.contains("validation: ok\n"), "{out}");
    assert!(
        out.contains("6 of 10 nodes change (1 distinct change):"),
        "{out}"
    );
    assert!(
        out.contains("    ~ layer2 vlan 100: mtu 9000 → 1500\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "rollout (maxUnavailable 2):\n  wave 1: 2 nodes: node-0, node-1; 4 unchanged node(s) moved \
             without applying\n  waves 2–3: 2 nodes each\n"
        ),
        "{out}"
    );
    let (_, j) = kn(
        c,
        &["plan", "-f", d, "--max-unavailable", "2", "-o", "json"],
    )
    .await;
    let v: Value = serde_json::from_str(&j).unwrap();
    let waves = v["rollout"]["waves"].as_array().unwrap();
    let applied: Vec<u64> = waves.iter().map(|w| w["count"].as_u64().unwrap()).collect();
    assert_eq!(applied, vec![2, 2, 2], "{j}");
    let free: u64 = waves.iter().map(|w| w["fastPath"].as_u64().unwrap()).sum();
    assert_eq!(free, 4, "rack b's config does not change: {j}");
    assert_eq!(
        v["objects"]["delete"],
        json!(["RoutingTable/extra"].iter().take(0).collect::<Vec<_>>())
    );

    // An invalid segment: the error names the object and field, and no rollout is planned.
    let bad = manifest_dir(&[("vrf.yaml", VRF_YAML), ("l2.yaml", &l2_yaml(100))]);
    let (_, out) = kn(c, &["plan", "-f", bad.to_str().unwrap()]).await;
    println!("{out}");
    assert!(out.contains("validation: 1 error(s)"), "{out}");
    assert!(
        out.contains("  error: Layer2NetworkConfiguration/vlan100 spec.mtu"),
        "{out}"
    );
    assert!(!out.contains("rollout ("), "{out}");
    // A misspelt field is an error naming the file, document and field.
    let typo = manifest_dir(&[("l2.yaml", &(l2_yaml(1500) + "  neighSupression: true\n"))]);
    let e = kn_err(c, &["plan", "-f", typo.to_str().unwrap()]).await;
    assert!(
        e.contains(
            "l2.yaml document 1 (Layer2NetworkConfiguration/vlan100): unknown field spec.neighSupression"
        ),
        "{e}"
    );

    // Against a saved Node list instead of the live Nodes.
    let nodes = json!({"apiVersion": "v1", "kind": "List", "items": [
        common::node("x-0", json!({"rack": "a"})),
        common::node("x-1", json!({"rack": "b"})),
    ]});
    let nodes_file = dir.join("nodes.json.snapshot");
    std::fs::write(&nodes_file, nodes.to_string()).unwrap();
    let (_, out) = kn(
        c,
        &["plan", "-f", d, "--nodes", nodes_file.to_str().unwrap()],
    )
    .await;
    assert!(out.contains("(2 nodes)"), "{out}");
    assert!(
        out.contains("  1 node: x-0\n    ~ layer2 vlan 100: mtu 9000 → 1500"),
        "{out}"
    );

    // Without the segment, rack a loses it: held when that is more than the threshold of what the
    // last good revision puts on the nodes, and the waves are what follows the approval.
    let vrf_only = manifest_dir(&[("vrf.yaml", VRF_YAML)]);
    let v = vrf_only.to_str().unwrap();
    let (_, out) = kn(c, &["plan", "-f", v]).await;
    println!("{out}");
    assert!(!out.contains("held:"), "under the default threshold: {out}");
    assert!(out.contains("rollout (maxUnavailable 10%):"), "{out}");
    let (_, out) = kn(c, &["plan", "-f", v, "--destructive-threshold", "10"]).await;
    println!("{out}");
    let held = "removes 1 of the 2 objects the last good revision";
    assert!(out.contains("held: rev-") && out.contains(held), "{out}");
    assert!(
        out.contains("no node gets it until an admin resumes it (`kubectl netwave resume`)"),
        "{out}"
    );
    assert!(
        out.contains("rollout once resumed (maxUnavailable 10%):"),
        "{out}"
    );
    let (_, j) = kn(
        c,
        &[
            "plan",
            "-f",
            v,
            "--destructive-threshold",
            "10",
            "-o",
            "json",
        ],
    )
    .await;
    let j: Value = serde_json::from_str(&j).unwrap();
    assert!(
        j["held"].as_str().is_some_and(|h| h.starts_with(held)),
        "{j}"
    );

    assert_eq!(live_inputs(c).await, before, "plan writes nothing");
    assert_eq!(
        kubectl_netwave::cluster::revisions(c).await.unwrap().len(),
        1
    );
    for d in [dir, bad, typo, vrf_only] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// Polls `f` until it returns `Some`, for at most `secs`.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    secs: u64,
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let timeout = std::time::Duration::from_secs(secs);
    netwave_control_plane::poll::until(what, timeout, async || {
        Ok(f().await.ok_or_else(|| "not yet".to_string()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

/// The whole loop with the real configurator (in-process) and simulated agents: `status -w` follows a
/// rollout to the end; `abort` of a stuck rollout brings every node back to the last good revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_follows_a_live_rollout_and_abort_rolls_it_back() {
    use netwave_agent::sim::Answer;
    use netwave_core::revision::{inputs_hash, revision_name};

    let env = env().await;
    let c = &env.client;
    for i in 0..3 {
        create_node(c, &format!("node-{i}"), json!({"rack": "a"})).await;
    }
    // Agents answer at once, except for the bad revision: they never report (a hung apply).
    let bad = revision_name(&inputs_hash(&inputs(1500, false)));
    let hang = bad.clone();
    let _agents = Task(netwave_agent::sim::spawn(
        c.clone(),
        std::sync::Arc::new(move |nnc: &netwave_api::NodeNetworkConfig| {
            if nnc.spec.revision == hang {
                Answer::Silent
            } else {
                Answer::Provisioned
            }
        }),
        std::time::Duration::from_millis(100),
    ));
    let args = netwave_configurator::testing::args(&["--max-unavailable", "1"]);
    let configurator = Task(tokio::spawn({
        let c = c.clone();
        async move {
            let _ = netwave_configurator::runtime::run_with(args, c, std::future::pending()).await;
        }
    }));

    // status -w, started before there is anything to show, follows the first rollout to the end.
    let out = Shared::default();
    let watch = spawn_kn(
        c,
        &["status", "-w", "--until-done", "--timeout", "60"],
        out.clone(),
    );
    create_inputs(c, &inputs(9000, false)).await;
    let exit = watch.await.unwrap().unwrap();
    let text = out.text();
    println!("{text}");
    assert_eq!(exit, Exit::Success, "{text}");
    assert!(text.starts_with("there are no revisions yet"), "{text}");
    let frames = text.matches("\nrevision rev-").count() + 1;
    assert!(
        frames >= 3,
        "re-rendered as the rollout moved ({frames} frames): {text}"
    );
    let last = &text[text.rfind("revision rev-").unwrap()..];
    assert!(last.contains("phase Complete"), "{last}");
    assert!(last.contains("3/3 updated"), "{last}");
    // Objects created one by one may cut intermediate revisions; the complete one is the last good.
    let revs = kubectl_netwave::cluster::revisions(c).await.unwrap();
    let good_rev = kubectl_netwave::cluster::last_good(&revs, None).unwrap();
    let good = good_rev.metadata.name.clone().unwrap();
    let good_seq = good_rev.spec.sequence;

    // A change whose apply hangs: one node takes it and never reports.
    kube::Api::<netwave_api::Layer2NetworkConfiguration>::all(c.clone())
        .patch(
            "vlan100",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"mtu": 1500}})),
        )
        .await
        .unwrap();
    eventually(30, "a node applying the bad revision", || async {
        let configs = kubectl_netwave::cluster::configs(c).await.unwrap();
        configs.iter().any(|n| n.spec.revision == bad).then_some(())
    })
    .await;
    let bad_seq = revision(c, &bad).await.spec.sequence;
    let (_, out) = kn(c, &["status"]).await;
    println!("{out}");
    assert!(
        out.contains(&format!(
            "revision {bad} (seq {bad_seq})  phase Progressing"
        )),
        "{out}"
    );
    assert!(out.contains("0/3 updated  1 in flight"), "{out}");
    assert!(
        out.contains("applying  agent has not reported") || out.contains("applying  still runs"),
        "{out}"
    );

    let (exit, out) = kn(c, &["abort"]).await;
    println!("{out}");
    assert_eq!(exit, Exit::NotConfirmed);
    assert!(
        out.starts_with(&format!(
            "1. pause {bad} (seq {bad_seq}): no further node gets it\n2. bring back the inputs of \
             {good} (seq {good_seq}):"
        )),
        "{out}"
    );
    assert!(
        out.contains("  ~ update Layer2NetworkConfiguration/vlan100: mtu 1500 → 9000"),
        "{out}"
    );
    assert!(!revision(c, &bad).await.spec.paused);

    let (exit, out) = kn(c, &["abort", "--yes"]).await;
    assert_eq!(exit, Exit::Success, "{out}");
    assert!(
        revision(c, &bad).await.spec.paused,
        "the aborted revision is paused"
    );
    // The configurator makes the good revision the target again and every node goes back to it.
    eventually(
        60,
        "every node Provisioned on the good revision again",
        || async {
            let configs = kubectl_netwave::cluster::configs(c).await.unwrap();
            (configs.len() == 3
                && configs.iter().all(|n| {
                    n.spec.revision == good
                        && n.status.as_ref().is_some_and(|s| {
                            s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                                && s.observed_revision.as_deref() == Some(good.as_str())
                        })
                }))
            .then_some(())
        },
    )
    .await;
    let (_, out) = kn(c, &["history"]).await;
    println!("{out}");
    let target_line = out.lines().find(|l| l.contains("<- target")).unwrap();
    assert!(
        target_line.starts_with(&format!("{} ", bad_seq + 1)) && target_line.contains(&good),
        "reactivated with the next sequence: {out}"
    );
    let (_, out) = kn(c, &["status"]).await;
    assert!(out.contains("3/3 updated"), "{out}");
    drop(configurator);
}

/// The built binary as kubectl finds it on PATH: `kubectl netwave …`, with kubectl's KUBECONFIG.
#[tokio::test]
async fn kubectl_runs_the_plugin_binary() {
    let env = env().await;
    let c = &env.client;
    let name = create_revision(
        c,
        &inputs(9000, false),
        1,
        json!({"phase": RevisionPhase::Complete.as_str(), "total": 2, "updated": 2}),
    )
    .await;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_kubectl-netwave"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |args: &[&str]| {
        let out = env
            .cp
            .kubectl()
            .env("PATH", &path)
            .arg("netwave")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&["history"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&name) && out.contains("2/2") && out.contains("<- target"),
        "{out}"
    );

    let (code, _, err) = run(&["status", "rev-nope"]);
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim(),
        "error: revision rev-nope not found; `kubectl netwave history` lists them"
    );
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, Some(0));
    for cmd in [
        "status", "history", "pause", "resume", "retry", "abort", "undo", "diff", "plan",
    ] {
        assert!(
            out.contains(&format!("\n  {cmd} ")),
            "--help lists {cmd}: {out}"
        );
    }
    assert!(out.contains("Typical session:"), "{out}");
    let (_, out, _) = run(&["abort", "--help"]);
    assert!(out.contains("netwave has no abort switch"), "{out}");
    let (code, _, err) = run(&["undo", "--to"]);
    assert_eq!(code, Some(2), "a usage error: {err}");
}

/// `release` lifts a quarantine (#27 item 10): the annotation the configurator wrote goes, the rest of
/// the node config stays; a node that is not quarantined is left alone.
#[tokio::test]
async fn release_lifts_a_quarantine_and_nothing_else() {
    let env = env().await;
    let c = &env.client;
    let (good, _) = mid_rollout(c).await;
    let nncs = kube::Api::<netwave_api::NodeNetworkConfig>::all(c.clone());
    let note = "since 2026-11-23T10:00:00Z: failed rev-a, rev-b in a row while other nodes provisioned them";
    nncs.patch(
        "node-3",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
            netwave_api::QUARANTINED_ANNOTATION: note}}})),
    )
    .await
    .unwrap();

    let (exit, out) = kn(c, &["release", "node-3"]).await;
    assert_eq!(exit, Exit::Success);
    assert!(
        out.starts_with(&format!("released node-3 (quarantined {note})")),
        "{out}"
    );
    let nnc = nncs.get("node-3").await.unwrap();
    let annotations = nnc.metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key(netwave_api::QUARANTINED_ANNOTATION));
    assert!(
        annotations.contains_key("netwave.dev/assigned-at"),
        "the rest stays"
    );
    assert_eq!(nnc.spec.revision, good);

    let (exit, out) = kn(c, &["release", "node-3"]).await;
    assert_eq!(exit, Exit::Success);
    assert_eq!(out.trim(), "node-3 is not quarantined: nothing to do");
    let e = kn_err(c, &["release", "node-9"]).await;
    assert!(e.contains("reading NodeNetworkConfig node-9"), "{e}");
}

/// DESIGN.md §6, "One bad object never blinds the fleet", for the admin's own views: a revision, a
/// node config and a routing table stored before their schema bounds existed cannot be decoded.
/// `status`, `history` and `plan` still work, leave them out as the configurator does and say what
/// each one holds; `undo`, which writes, refuses and names them.
#[tokio::test]
async fn the_views_work_and_say_what_is_wrong_while_objects_cannot_be_decoded() {
    use kube::api::{ApiResource, DynamicObject};
    let env = env().await;
    let c = &env.client;
    for i in 0..3 {
        create_node(c, &format!("node-{i}"), json!({"rack": "a"})).await;
    }
    let old = create_revision(
        c,
        &inputs(1500, false),
        1,
        json!({"phase": RevisionPhase::Superseded.as_str()}),
    )
    .await;
    let good = create_revision(
        c,
        &inputs(9000, true),
        2,
        json!({"phase": RevisionPhase::Complete.as_str(), "total": 3, "updated": 3}),
    )
    .await;
    create_inputs(c, &inputs(9000, true)).await;
    for i in 0..3 {
        let ok = json!({"phase": "Provisioned", "observedRevision": good, "observedRetry": 0});
        create_config(
            c,
            &format!("node-{i}"),
            &good,
            2,
            "2026-01-01T00:00:00Z",
            ok,
        )
        .await;
    }

    // As objects from before the bounds were stored: untyped writes under the schemas without them.
    let dynamic = |ar: ApiResource| Api::<DynamicObject>::all_with(c.clone(), &ar);
    let (ncrs, nncs, rts) = (
        dynamic(ApiResource::erase::<NetworkConfigRevision>(&())),
        dynamic(ApiResource::erase::<NodeNetworkConfig>(&())),
        dynamic(ApiResource::erase::<RoutingTable>(&())),
    );
    let retry = |n: u64| Patch::Merge(json!({"status": {"observedRetry": n}}));
    let metric = |n: u64| {
        Patch::<()>::Json(
            serde_json::from_value(json!([
                {"op": "add", "path": "/spec/routes/0/metric", "value": n}
            ]))
            .unwrap(),
        )
    };
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let status_retry = "/properties/status/properties/observedRetry";
    let relaxed = netwave_configurator::testing::crds_without_bound(&[
        ("networkconfigrevisions.yaml", status_retry),
        ("nodenetworkconfigs.yaml", status_retry),
        (
            "routingtables.yaml",
            "/properties/spec/properties/routes/items/properties/metric",
        ),
    ]);
    let probe = |n: u64| {
        let (ncrs, nncs, rts) = (&ncrs, &nncs, &rts);
        let (retry, metric, dry, old) = (&retry, &metric, &dry, &old);
        async move {
            ncrs.patch_status(old, dry, &retry(n)).await?;
            nncs.patch_status("node-1", dry, &retry(n)).await?;
            rts.patch("extra", dry, &metric(n)).await.map(drop)
        }
    };
    let cp = &env.cp;
    (cp.install_crds_validating(c, relaxed, true, || probe(1 << 32)))
        .await
        .unwrap();
    let pp = PatchParams::default();
    ncrs.patch_status(&old, &pp, &retry(1 << 32)).await.unwrap();
    nncs.patch_status("node-1", &pp, &retry(1 << 32))
        .await
        .unwrap();
    rts.patch("extra", &pp, &metric(1 << 32)).await.unwrap();
    let strict = netwave_api::crds().into_iter().map(|(_, c)| c);
    (cp.install_crds_validating(c, strict, false, || probe((1 << 32) + 1)))
        .await
        .unwrap();
    let e = kubectl_netwave::cluster::revisions(c).await.unwrap_err();
    assert!(format!("{e:#}").contains("fix or delete it first"), "{e:#}");

    let (exit, out) = kn(c, &["status"]).await;
    println!("{out}");
    assert_eq!(exit, Exit::Success);
    assert!(
        out.contains(&format!("revision {good} (seq 2)  phase Complete")),
        "{out}"
    );
    assert!(out.contains("cannot read 3 object(s)"), "{out}");
    for says in [
        "RoutingTable extra cannot be decoded (spec.routes[0].metric: ".into(),
        "no revision is cut from the inputs until it is fixed".into(),
        format!("NetworkConfigRevision {old} cannot be decoded (status.observedRetry: "),
        "the rollout is held".into(),
        "NodeNetworkConfig node-1 cannot be decoded (status.observedRetry: ".into(),
        "node node-1's state is unknown".into(),
    ] {
        assert!(out.contains(&says), "{says}: {out}");
    }
    let (_, j) = kn(c, &["status", "-o", "json"]).await;
    let j: Value = serde_json::from_str(&j).unwrap();
    assert_eq!(j["unreadable"].as_array().map(Vec::len), Some(3), "{j}");
    // A revision that cannot be read is not one `status` can show.
    let e = kn_err(c, &["status", &old]).await;
    assert!(
        e.contains("not found") && e.contains("cannot read 3 object(s)"),
        "{e}"
    );

    let (_, out) = kn(c, &["history"]).await;
    println!("{out}");
    assert!(
        out.contains(&good) && !out.contains(&format!("   {old}   ")),
        "{out}"
    );
    assert!(
        out.contains(&format!("NetworkConfigRevision {old} cannot be decoded")),
        "{out}"
    );

    let dir = manifest_dir(&[("vrf.yaml", VRF_YAML), ("l2.yaml", &l2_yaml(9000))]);
    let (_, out) = kn(c, &["plan", "-f", dir.to_str().unwrap()]).await;
    println!("{out}");
    assert!(out.contains("cannot read 3 object(s)"), "{out}");
    assert!(
        out.contains("  - delete RoutingTable/extra, which cannot be read (not in the directory)"),
        "{out}"
    );
    assert!(out.contains("rollout (maxUnavailable"), "{out}");
    std::fs::remove_dir_all(dir).unwrap();

    let e = kn_err(c, &["undo", "--to", "1"]).await;
    assert!(
        e.contains(&format!("NetworkConfigRevision {old} cannot be decoded"))
            && e.contains("fix or delete"),
        "{e}"
    );
}

/// The real configurator (in-process, `--revision-names=sequence`) and simulated agents roll out two
/// revisions on 3 nodes: the first, superseded, keeps what its rollout reached (`status.reached`: 3 of
/// 3) while its live `updated` drops to the 0 nodes that still run it, and `kubectl get ncr` and
/// `history` say 3/3. `kubectl get ncr` lists the revisions in creation order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_get_keep_what_a_superseded_rollout_reached() {
    let env = env().await;
    let c = &env.client;
    for i in 0..3 {
        create_node(c, &format!("node-{i}"), json!({"rack": "a"})).await;
    }
    let _agents = Task(netwave_agent::sim::spawn(
        c.clone(),
        std::sync::Arc::new(|_: &NodeNetworkConfig| netwave_agent::sim::Answer::Provisioned),
        std::time::Duration::from_millis(100),
    ));
    let args = netwave_configurator::testing::args(&[
        "--max-unavailable",
        "1",
        "--revision-names",
        "sequence",
    ]);
    let _configurator = Task(tokio::spawn({
        let c = c.clone();
        async move {
            let _ = netwave_configurator::runtime::run_with(args, c, std::future::pending()).await;
        }
    }));
    let complete = |mtu: u32| {
        let hash = netwave_core::revision::inputs_hash(&inputs(mtu, false));
        async move {
            eventually(60, "the rollout to complete", || async {
                let revs = kubectl_netwave::cluster::revisions(c).await.ok()?;
                let r = revs.iter().find(|r| r.spec.hash == hash)?;
                (r.status.as_ref()?.phase.as_deref() == Some(RevisionPhase::Complete.as_str()))
                    .then(|| r.metadata.name.clone().unwrap())
            })
            .await
        }
    };
    create_inputs(c, &inputs(9000, false)).await;
    let first = complete(9000).await;
    Api::<netwave_api::Layer2NetworkConfiguration>::all(c.clone())
        .patch(
            "vlan100",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mtu": 1500}})),
        )
        .await
        .unwrap();
    let second = complete(1500).await;

    let st = eventually(30, "the first revision superseded", || async {
        let st = revision(c, &first).await.status?;
        (st.phase.as_deref() == Some(RevisionPhase::Superseded.as_str())).then_some(st)
    })
    .await;
    assert_eq!(
        (st.updated, st.total),
        (0, 3),
        "no node runs it now: {st:?}"
    );
    assert_eq!(
        st.reached,
        Some(netwave_api::Reached {
            updated: 3,
            total: 3
        }),
        "{st:?}"
    );

    let out = env
        .cp
        .kubectl()
        .args(["get", "ncr", "-o", "wide", "--no-headers"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{table}");
    let row = |name: &str| -> Vec<String> {
        let line = table.lines().find(|l| l.starts_with(name)).unwrap_or("");
        line.split_whitespace().map(str::to_string).collect()
    };
    // NAME SEQ PHASE UPDATED TOTAL RUNNING IN-PROGRESS FAILED …
    assert_eq!(row(&first)[2..6], ["Superseded", "3", "3", "0"], "{table}");
    assert_eq!(row(&second)[2..6], ["Complete", "3", "3", "3"], "{table}");
    // Listed by name, which is by sequence: the API server's order is the creation order.
    let seqs: Vec<u64> = (table.lines())
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(seqs.len() >= 2 && seqs.is_sorted(), "{table}");
    for name in [&first, &second] {
        let seq = revision(c, name).await.spec.sequence;
        assert!(name.starts_with(&format!("rev-{seq:08}-")), "{name}");
    }

    let (_, out) = kn(c, &["history"]).await;
    println!("{out}");
    let line = out.lines().find(|l| l.contains(&first)).unwrap();
    assert!(line.contains("Superseded   3/3"), "{out}");
    let (_, j) = kn(c, &["history", "-o", "json"]).await;
    let j: Value = serde_json::from_str(&j).unwrap();
    let rows = j.as_array().unwrap();
    let first_row = rows.iter().find(|r| r["name"] == first.as_str()).unwrap();
    assert_eq!(
        (&first_row["updated"], &first_row["running"]),
        (&json!(3), &json!(0)),
        "{j}"
    );
}

/// One change across clusters (#50): `clusters` asks every context of a kubeconfig at once — a canary
/// whose netwave failed the change (its nodes back on the last good revision), another cluster that
/// completed the previous change, a third that cannot be reached — and says each one's state on its
/// own line, the unreachable one included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_shows_every_contexts_revision_and_phase() {
    use kube::config::Kubeconfig;
    let canary = env().await;
    let rest = env().await;
    let good = inputs(9000, false);
    for e in [&canary, &rest] {
        create_revision(
            &e.client,
            &good,
            1,
            json!({"phase": RevisionPhase::Complete.as_str(), "reached": {"updated": 4, "total": 4}}),
        )
        .await;
    }
    let failed = create_revision(
        &canary.client,
        &inputs(1500, false),
        2,
        json!({"phase": RevisionPhase::Failed.as_str(), "observedRetry": 0}),
    )
    .await;
    let good_name = netwave_core::revision::revision_name(&netwave_core::revision::inputs_hash(
        &netwave_core::revision::canonical_inputs(&good),
    ));

    // One kubeconfig, three contexts: the two clusters, and one whose server does not answer.
    let renamed = |path: &std::path::Path, to: &str, server: Option<&str>| {
        let mut kc = Kubeconfig::read_from(path).unwrap();
        for c in &mut kc.contexts {
            c.name = to.into();
            let ctx = c.context.as_mut().unwrap();
            ctx.cluster = to.into();
            ctx.user = Some(to.into());
        }
        for c in &mut kc.clusters {
            c.name = to.into();
            if let Some(s) = server {
                c.cluster.as_mut().unwrap().server = Some(s.into());
            }
        }
        for u in &mut kc.auth_infos {
            u.name = to.into();
        }
        kc.current_context = Some(to.into());
        kc
    };
    let kc = renamed(canary.cp.kubeconfig(), "canary", None)
        .merge(renamed(rest.cp.kubeconfig(), "eu-1", None))
        .unwrap()
        .merge(renamed(
            rest.cp.kubeconfig(),
            "gone",
            Some("https://127.0.0.1:9"),
        ))
        .unwrap();
    let path =
        std::env::temp_dir().join(format!("kubectl-netwave-clusters-{}", std::process::id()));
    std::fs::write(&path, serde_saphyr::to_string(&kc).unwrap()).unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-netwave"))
        .args([
            "--kubeconfig",
            path.to_str().unwrap(),
            "clusters",
            "--timeout",
            "5",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    let line = |ctx: &str| -> String {
        text.lines()
            .find(|l| l.starts_with(&format!("{ctx} ")))
            .unwrap_or_else(|| panic!("no line for {ctx}: {text}"))
            .to_string()
    };
    let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        words(&line("canary"))[1..6],
        [&good_name, "1", "Complete", "4/4", &good_name].map(String::from)
    );
    assert!(
        line("canary").ends_with(&format!("{failed} failed")),
        "{text}"
    );
    assert_eq!(
        words(&line("eu-1"))[1..6],
        [&good_name, "1", "Complete", "4/4", &good_name].map(String::from)
    );
    assert!(!line("eu-1").contains("failed"), "{text}");
    assert!(line("gone").contains("127.0.0.1:9"), "{text}");

    // JSON for scripts, and only the contexts asked for.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-netwave"))
        .args(["--kubeconfig", path.to_str().unwrap(), "clusters"])
        .args(["--contexts", "canary,eu-1", "-o", "json"])
        .output()
        .unwrap();
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(2), "{rows}");
    assert_eq!(rows[0]["failed"], json!(failed));
    assert_eq!(rows[1]["phase"], json!("Complete"));
    std::fs::remove_file(path).unwrap();
}
