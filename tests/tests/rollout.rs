//! End to end: real testbed, two configurator processes, one agent process per node inside its network
//! namespace, the samples of `deploy/samples/`. Needs root (skips with a message otherwise). Fleets run
//! one at a time ([`Fleet::lock`]).

use netwave_api::vocab::{NodeReason, RevisionPhase};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use netwave_api::manifest::samples;
use netwave_e2e::fleet::{
    ApiServer, Bins, DATA_GATEWAY, Fleet, FleetOptions, PROBE_TARGET, phase, provisioned_on,
};
use netwave_e2e::netns::{is_root, namespaces_of, ping_in};
use serde_json::json;

const T: Duration = Duration::from_secs(120);

fn bins() -> Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| Bins::build().expect("netwave binaries build"))
        .clone()
}

fn skip() -> bool {
    if !is_root() {
        eprintln!("SKIPPED: end-to-end tests need root (network namespaces, netlink)");
        return true;
    }
    false
}

async fn start(opts: FleetOptions) -> Fleet {
    Fleet::start(bins(), opts).await.expect("fleet starts")
}

/// Applies the samples and waits for the first revision to complete; returns its name.
async fn roll_out_samples(f: &Fleet) -> String {
    f.apply(&samples().unwrap()).await.unwrap();
    let rev = f
        .wait_latest(0, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    rev.metadata.name.unwrap()
}

/// A routing table that blackholes the probe target of `node` only (a policy rule for "monitoring"
/// traffic that catches the fabric address): the agent's ICMP probe fails after the apply.
fn blackhole_probe_target(node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "bad-monitoring"},
        "spec": {
            "tableId": 300,
            "routes": [{"prefix": format!("{PROBE_TARGET}/32"), "type": "blackhole"}],
            "rules": [{"to": format!("{PROBE_TARGET}/32"), "priority": 300}],
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_rollout_to_six_nodes_within_budget_and_the_data_plane_works() {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    let mut f = start(FleetOptions::default()).await;
    f.apply(&samples().unwrap()).await.unwrap();
    // Sample the fleet while it rolls: never more than maxUnavailable (2) nodes in flight (spec
    // revision not yet reported Provisioned, whatever revision: intermediate ones count too).
    let mut max_in_flight = 0;
    let name =
        netwave_control_plane::poll::until("six nodes on a Complete revision", T, async || {
            let configs = f.configs().await?;
            // A placeholder (queued, nothing assigned) is not in flight: nothing is applied there.
            let in_flight = configs
                .values()
                .filter(|c| !c.spec.is_placeholder() && !provisioned_on(c, &c.spec.revision))
                .count();
            max_in_flight = max_in_flight.max(in_flight);
            let revs = f.revisions().await?;
            if let Some(r) = revs.last() {
                let name = r.metadata.name.clone().unwrap_or_default();
                if phase(r) == RevisionPhase::Complete.as_str()
                    && configs.len() == 6
                    && configs.values().all(|c| provisioned_on(c, &name))
                {
                    return Ok(Ok(name));
                }
            }
            Ok(Err(format!(
                "{} configs, newest revision {:?}",
                configs.len(),
                revs.last().map(phase)
            )))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", f.logs_tail(10)));
    assert!(
        max_in_flight <= 2,
        "{max_in_flight} nodes in flight at once"
    );
    let done = f
        .wait_phase(&name, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    let st = done.status.unwrap();
    assert_eq!((st.total, st.updated, st.failed), (6, 6, 0));

    // One writer per field, as the API server's server-side apply records it: the configurator owns
    // every NodeNetworkConfig's spec, the node's agent its status, and nobody else owns either. A node
    // that waited in this first rollout had a placeholder (its status never written since #28; an
    // older configurator wrote Queued, then Pending, there); the agent's reports took every field over,
    // and a field can stay shared only where the agent wrote the very same value (a transition time
    // within the same second): the configurator never owns a status field the agent does not.
    for (node, c) in f.configs().await.unwrap() {
        let fields = |manager: &str, part: &str| -> Option<std::collections::BTreeSet<String>> {
            let mut out: Option<std::collections::BTreeSet<String>> = None;
            for m in c.metadata.managed_fields.iter().flatten() {
                let Some(owned) = m.fields_v1.as_ref().and_then(|f| f.0.get(part)) else {
                    continue;
                };
                if m.manager.as_deref() != Some(manager) {
                    continue;
                }
                let keys = owned
                    .as_object()
                    .into_iter()
                    .flat_map(|o| o.keys().cloned());
                out.get_or_insert_default().extend(keys);
            }
            out
        };
        let managers = |part: &str| -> std::collections::BTreeSet<String> {
            c.metadata
                .managed_fields
                .iter()
                .flatten()
                .filter(|m| {
                    m.fields_v1
                        .as_ref()
                        .is_some_and(|f| f.0.get(part).is_some())
                })
                .filter_map(|m| m.manager.clone())
                .collect()
        };
        assert_eq!(
            managers("f:spec"),
            ["netwave-configurator".to_string()].into(),
            "{node}"
        );
        let status_managers = managers("f:status");
        assert!(
            status_managers
                .iter()
                .all(|m| m == "netwave-agent" || m == "netwave-configurator"),
            "{node}: {status_managers:?}"
        );
        let agent = fields("netwave-agent", "f:status").unwrap_or_default();
        assert!(
            agent.contains("f:phase"),
            "{node}: the agent owns its status"
        );
        if let Some(configurator) = fields("netwave-configurator", "f:status") {
            let extra: Vec<&String> = configurator
                .iter()
                .filter(|k| *k != "." && !agent.contains(*k))
                .collect();
            assert!(
                extra.is_empty(),
                "{node}: the configurator alone owns {extra:?}"
            );
        }
    }

    // Kernel: every node runs the data segment with its anycast gateway.
    for n in f.node_names() {
        let state = f.kernel_state(&n).unwrap();
        assert!(state.contains("addr l2.103 10.250.3.1/24"), "{n}: {state}");
        assert!(state.contains("link vx.103 kind=vxlan"), "{n}: {state}");
    }

    // Data plane: flooding entries (stand-in for EVPN type-3 routes), a workload per node, pings across
    // the VXLAN segment between nodes and to the anycast gateway.
    assert!(f.install_flood_entries().unwrap() > 0);
    let workloads = f.add_workloads().unwrap();
    for (i, (node, ns, _)) in workloads.iter().enumerate() {
        let (peer, _, peer_addr) = &workloads[(i + 1) % workloads.len()];
        assert!(ping_in(ns, DATA_GATEWAY), "{node}: anycast gateway");
        let mut ok = false;
        for _ in 0..3 {
            ok = ping_in(ns, peer_addr);
            if ok {
                break;
            }
        }
        assert!(ok, "{node} → {peer} ({peer_addr}) over vx.103");
    }
    let run = f.net.run_id.clone();
    drop(f);
    assert_eq!(namespaces_of(&run), Vec::<String>::new(), "nothing left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_revision_halts_after_the_first_failure_and_touched_nodes_return_to_last_good() {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    let f = start(FleetOptions::default()).await;
    let good = roll_out_samples(&f).await;
    let before: BTreeMap<String, String> = f
        .node_names()
        .into_iter()
        .map(|n| {
            let s = f.kernel_state(&n).unwrap();
            (n, s)
        })
        .collect();
    let seq = f.revisions().await.unwrap().last().unwrap().spec.sequence;
    f.create_routing_table(blackhole_probe_target("node-3"))
        .await
        .unwrap();
    let failed = f
        .wait_latest(seq, &[RevisionPhase::Failed], T)
        .await
        .unwrap();
    let st = failed.status.unwrap();
    assert_eq!(st.failed, 1, "halted after the first failure");
    assert_eq!(st.failed_nodes[0].node, "node-3");
    assert_eq!(
        st.failed_nodes[0].reason,
        NodeReason::HealthCheckFailed.as_str()
    );
    // Every node ends on the last good revision, and its kernel equals what it was.
    f.wait_all_on(&good, T).await.unwrap();
    for (n, want) in &before {
        assert_eq!(&f.kernel_state(n).unwrap(), want, "{n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_rollout_the_standby_resumes_and_completes() {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    // One node at a time, each apply held open for a second: the rollout takes long enough to act
    // in the middle of it.
    let mut f = start(FleetOptions {
        max_unavailable: 1,
        settle_secs: 1.0,
        ..FleetOptions::default()
    })
    .await;
    f.apply(&samples().unwrap()).await.unwrap();
    // The samples' revision: the one whose configs carry the routing table oob (created last).
    let name = f
        .eventually(T, "the full samples revision", || async {
            let inputs: kube::Api<netwave_api::NetworkConfigInputs> =
                kube::Api::all(f.client.clone());
            let inputs = inputs
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let revs = f.revisions().await.map_err(|e| e.to_string())?;
            revs.into_iter()
                .rfind(|r| {
                    inputs.items.iter().any(|i| {
                        i.metadata.name == r.metadata.name
                            && i.spec.routing_tables.len() == 2
                            && i.spec.layer2s.len() == 12
                    })
                })
                .and_then(|r| r.metadata.name)
                .ok_or_else(|| "not yet".to_string())
        })
        .await
        .unwrap();
    // Mid-rollout: at least one node done, not all.
    f.eventually(T, "one node updated", || async {
        let n = f
            .configs()
            .await
            .map_err(|e| e.to_string())?
            .values()
            .filter(|c| provisioned_on(c, &name))
            .count();
        if (1..6).contains(&n) {
            Ok(())
        } else {
            Err(format!("{n} updated"))
        }
    })
    .await
    .unwrap();
    // Whatever revisions exist now (input settling makes the samples one, but a slow machine may still
    // cut an intermediate one), the failover must add none and revert to none.
    let before_kill: Vec<_> = f
        .revisions()
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.metadata.name, r.spec.sequence))
        .collect();
    let old = f.kill_leader().await.unwrap();
    assert_eq!(f.configurators_running(), 1);
    let new = f
        .eventually(T, "a new leader", || async {
            match f.leader().await.map_err(|e| e.to_string())? {
                Some(l) if l != old => Ok(l),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap();
    assert_ne!(new, old);
    let done = f
        .wait_phase(&name, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    assert_eq!(done.status.unwrap().updated, 6);
    f.wait_all_on(&name, T).await.unwrap();
    let after: Vec<_> = f
        .revisions()
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.metadata.name, r.spec.sequence))
        .collect();
    assert_eq!(after, before_kill, "no revert, no new revision");
}

/// Rolls the samples out, then changes the data segment's MTU: a second revision touching every node.
async fn second_revision(f: &Fleet, mtu: u32) -> String {
    let seq = f.revisions().await.unwrap().last().unwrap().spec.sequence;
    f.patch_layer2("vlan103-monitoring", json!({"mtu": mtu}))
        .await
        .unwrap();
    f.wait_new_revision(seq, T)
        .await
        .unwrap()
        .metadata
        .name
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_mid_apply_restarts_restores_and_the_rollout_completes() {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    // A long settle time keeps each apply open (marker written, verdict pending) for a while.
    let mut f = start(FleetOptions {
        settle_secs: 1.5,
        ..FleetOptions::default()
    })
    .await;
    roll_out_samples(&f).await;
    let rev = second_revision(&f, 8000).await;
    let victim = f
        .eventually(T, "a node assigned the new revision", || async {
            let configs = f.configs().await.map_err(|e| e.to_string())?;
            configs
                .iter()
                .find(|(_, c)| c.spec.revision == rev && !provisioned_on(c, &rev))
                .map(|(n, _)| n.clone())
                .ok_or_else(|| "none yet".to_string())
        })
        .await
        .unwrap();
    // Kill once the agent has started applying (its marker is on disk).
    let marker = f.state_dir(&victim).join("applying.json");
    f.eventually(T, "the applying marker", || async {
        if marker.exists() {
            Ok(())
        } else {
            Err(format!("{} absent", marker.display()))
        }
    })
    .await
    .unwrap();
    f.kill_agent(&victim);
    assert!(marker.exists(), "killed mid-apply");
    f.start_agent(&victim).unwrap();
    // The restarted agent restores the last good config first, then applies the revision again (a
    // single interruption is not a verdict on the config): the rollout completes without anyone's help.
    let done = f
        .wait_phase(&rev, &[RevisionPhase::Complete, RevisionPhase::Failed], T)
        .await
        .unwrap();
    let st = done.status.unwrap();
    assert_eq!(
        (st.phase.as_deref(), st.failed),
        (Some(RevisionPhase::Complete.as_str()), 0),
        "{:?}",
        st.failed_nodes
    );
    f.wait_all_on(&rev, T).await.unwrap();
    assert!(!marker.exists(), "marker settled after the restart");
    // The restarted node runs exactly what a node with the same config runs.
    let configs = f.configs().await.unwrap();
    let twin = configs
        .iter()
        .find(|(n, c)| **n != victim && c.spec.config_hash == configs[&victim].spec.config_hash)
        .map(|(n, _)| n.clone())
        .unwrap();
    assert_eq!(
        f.kernel_state(&victim).unwrap(),
        f.kernel_state(&twin).unwrap()
    );
    assert!(
        f.kernel_state(&victim)
            .unwrap()
            .contains("link vx.103 kind=vxlan mtu=8000")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_added_mid_rollout_gets_the_target_and_a_removed_node_is_forgotten() {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    // One node at a time, each apply held open for a second: the rollout takes long enough to act
    // in the middle of it.
    let mut f = start(FleetOptions {
        max_unavailable: 1,
        settle_secs: 1.0,
        ..FleetOptions::default()
    })
    .await;
    roll_out_samples(&f).await;
    let rev = second_revision(&f, 8000).await;
    f.eventually(T, "the second rollout under way", || async {
        let n = f
            .configs()
            .await
            .map_err(|e| e.to_string())?
            .values()
            .filter(|c| provisioned_on(c, &rev))
            .count();
        if n >= 1 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await
    .unwrap();
    let joined = f.add_node().await.unwrap();
    f.remove_node("node-5").await.unwrap();
    let done = f
        .wait_phase(&rev, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    let st = done.status.unwrap();
    assert_eq!((st.total, st.updated, st.failed), (6, 6, 0), "{st:?}");
    f.wait_all_on(&rev, T).await.unwrap();
    let configs = f.configs().await.unwrap();
    assert!(
        !configs.contains_key("node-5"),
        "the departed node is forgotten"
    );
    assert!(
        provisioned_on(&configs[&joined], &rev),
        "{joined} runs the target"
    );
    assert!(
        f.kernel_state(&joined)
            .unwrap()
            .contains("link vx.103 kind=vxlan mtu=8000")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_faults_slow_the_rollout_without_false_failures() {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    // Faults are injected by the testbed (a real API server cannot fail a fifth of writes on request).
    let f = start(FleetOptions {
        server: ApiServer::Testbed,
        ..FleetOptions::default()
    })
    .await;
    let t0 = Instant::now();
    roll_out_samples(&f).await;
    let clean = t0.elapsed();
    // Every request 100 ms slower, a fifth of writes fail with 500, all watches cut once.
    f.admin(
        "POST",
        "/testbed/faults",
        Some(json!({"match": {}, "action": {"delay": 100}, "budget": "always"})),
    )
    .await
    .unwrap();
    for verb in ["patch", "update", "create"] {
        f.admin(
            "POST",
            "/testbed/faults",
            Some(json!({"match": {"verb": verb}, "action": {"fail": 500}, "budget": {"fraction": 0.2}})),
        )
        .await
        .unwrap();
    }
    let t1 = Instant::now();
    let rev = second_revision(&f, 8000).await;
    f.admin("POST", "/testbed/cut-watches", None).await.unwrap();
    let done = f
        .wait_phase(&rev, &[RevisionPhase::Complete, RevisionPhase::Failed], T)
        .await
        .unwrap();
    let faulty = t1.elapsed();
    let st = done.status.unwrap();
    assert_eq!((st.updated, st.failed), (6, 0), "{st:?}");
    f.admin("DELETE", "/testbed/faults", None).await.unwrap();
    f.wait_all_on(&rev, T).await.unwrap();
    eprintln!(
        "rollout to 6 nodes: {clean:.1?} clean (incl. revision), {faulty:.1?} under API faults"
    );
}

/// The demo's mode without root: same API server and configurators, simulated agents. Runs everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_kernel_mode_rolls_out_halts_and_rolls_back() {
    let _g = Fleet::lock().await;
    let f = start(FleetOptions {
        kernel: false,
        ..FleetOptions::default()
    })
    .await;
    let good = roll_out_samples(&f).await;
    let seq = f.revisions().await.unwrap().last().unwrap().spec.sequence;
    f.create_routing_table(blackhole_probe_target("node-3"))
        .await
        .unwrap();
    let failed = f
        .wait_latest(seq, &[RevisionPhase::Failed], T)
        .await
        .unwrap();
    let st = failed.status.unwrap();
    assert_eq!(st.failed, 1);
    assert_eq!(st.failed_nodes[0].node, "node-3");
    f.wait_all_on(&good, T).await.unwrap();
}
