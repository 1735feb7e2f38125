//! Hitless apply (#31): traffic a change is not about loses nothing while netwave applies it.
//!
//! A 3-node fleet with real FRR (BGP EVPN installs the flood entries) runs the samples; workloads on two
//! default-VRF segments send UDP at 100 packets/s each (`netwave_e2e::probe`): two flows across VLAN 103,
//! one across VLAN 111, one routed from 103 to 111 through the anycast gateways. Each scenario makes one
//! change, waits until the fleet has finished with it, and reads every flow's losses, reorders and longest
//! gap over that window. Flows the change does not touch must lose nothing; the changed ones' figures
//! are printed (the table `make bench` and the closing note quote).

use std::time::{Duration, Instant};

use netwave_api::manifest::samples;
use netwave_e2e::fleet::{Bins, Fleet, FleetOptions, PROBE_TARGET};
use netwave_e2e::install::metric_at;
use netwave_e2e::netns::is_root;
use netwave_e2e::probe::{Flow, FlowStats, Probe};
use serde_json::json;

const T: Duration = Duration::from_secs(120);

/// One scenario's result: (flow, figures, whether the change touches the flow).
type Row = (String, Vec<(String, FlowStats, bool)>, Duration);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_leave_the_traffic_they_do_not_touch_alone() {
    if !is_root() {
        eprintln!("SKIPPED: the hitless probe needs root (network namespaces, FRR)");
        return;
    }
    if !netwave_control_plane::frr::installed() {
        panic!("{}", netwave_control_plane::frr::INSTALL);
    }
    let bins = Bins::build().unwrap();
    let mut f = Fleet::start(
        bins,
        FleetOptions {
            nodes: 3,
            frr: true,
            ..FleetOptions::default()
        },
    )
    .await
    .unwrap();
    let rows = run(&mut f)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", f.logs_tail(20)));

    println!(
        "\nhitless apply: packets lost on each flow while the fleet applied each change (100/s per flow)"
    );
    println!(
        "{:<44} {:<22} {:>6} {:>5} {:>9} {:>9}  touched",
        "scenario (time to settle)", "flow", "sent", "lost", "reorder", "max gap"
    );
    let mut broken = Vec::new();
    for (scenario, flows, took) in &rows {
        for (flow, s, touched) in flows {
            println!(
                "{:<44} {:<22} {:>6} {:>5} {:>9} {:>7.0}ms  {}",
                format!("{scenario} ({:.1} s)", took.as_secs_f64()),
                flow,
                s.sent,
                s.lost,
                s.reordered,
                s.longest_gap.as_secs_f64() * 1000.0,
                if *touched { "yes" } else { "no" }
            );
            if !touched && s.lost > 0 {
                broken.push(format!("{scenario}: {flow} lost {} of {}", s.lost, s.sent));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "untouched flows lost packets:\n{}",
        broken.join("\n")
    );
}

async fn run(f: &mut Fleet) -> anyhow::Result<Vec<Row>> {
    f.apply(&samples()?).await?;
    let first = f.wait_latest(0, &["Complete"], T).await?;
    let mut seq = first.spec.sequence;
    f.wait_all_on(first.metadata.name.as_deref().unwrap_or_default(), T)
        .await?;

    // Workloads: wN-103 on l2.103 (10.250.3.10N), wN-111 on l2.111 (10.250.11.10N).
    let w103 = f.add_workloads()?;
    let mut w111 = Vec::new();
    for (i, node) in f.node_names().iter().enumerate() {
        let addr = format!("10.250.11.{}", 100 + i);
        let ns = f
            .net
            .add_workload_on(node, 1, "l2.111", &format!("{addr}/24"), "10.250.11.1")?;
        w111.push((ns, addr));
    }
    let flow = |name: &str, from: &str, to: &str, addr: &str| -> anyhow::Result<Flow> {
        Ok(Flow {
            name: name.into(),
            from: from.into(),
            to: to.into(),
            to_addr: addr.parse()?,
        })
    };
    let flows = vec![
        flow("103 node-0→node-1", &w103[0].1, &w103[1].1, &w103[1].2)?,
        flow("103 node-1→node-2", &w103[1].1, &w103[2].1, &w103[2].2)?,
        flow("111 node-0→node-2", &w111[0].0, &w111[2].0, &w111[2].1)?,
        flow("103→111 node-2→node-0", &w103[2].1, &w111[0].0, &w111[0].1)?,
    ];
    // EVPN has the remote VTEPs within seconds of the rollout; the probe waits for each flow's first
    // packet.
    let mut probe = Probe::start(flows, 100)?;
    let _ = probe.window();
    let touches_111 = |flow: &str| flow.contains("111");
    let mut rows: Vec<Row> = Vec::new();

    // 1. A new segment every node gets.
    let t = Instant::now();
    f.create_layer2(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "Layer2NetworkConfiguration",
        "metadata": {"name": "vlan120-new"},
        "spec": {"id": 120, "vni": 1000120, "mtu": 1500,
                 "anycastGateways": ["10.250.20.1/24"], "anycastMac": "02:00:5e:00:01:20"},
    }))
    .await?;
    seq = settle(f, seq, "Complete").await?;
    rows.push(window(&mut probe, "add a segment (VLAN 120)", t, |_| false));

    // 2. A route in a routing table.
    let t = Instant::now();
    f.create_routing_table(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "hitless-extra"},
        "spec": {"tableId": 310, "routes": [{"prefix": "198.18.250.0/24", "type": "blackhole"}]},
    }))
    .await?;
    seq = settle(f, seq, "Complete").await?;
    rows.push(window(
        &mut probe,
        "add a routing table with a route",
        t,
        |_| false,
    ));

    // 3. One segment's MTU: only its own flows may notice.
    let t = Instant::now();
    f.patch_layer2("vlan111-pxe", json!({"mtu": 1400})).await?;
    seq = settle(f, seq, "Complete").await?;
    rows.push(window(&mut probe, "change VLAN 111's MTU", t, touches_111));

    // 4. The segment of step 1 removed again.
    let t = Instant::now();
    f.delete_layer2("vlan120-new").await?;
    seq = settle(f, seq, "Complete").await?;
    rows.push(window(&mut probe, "remove a segment (VLAN 120)", t, |_| {
        false
    }));

    // 5. An agent killed and started again: its backup equals what it runs.
    let t = Instant::now();
    f.kill_agent("node-1");
    f.start_agent("node-1")?;
    // Its first drift check compared the kernel and FRR with the backup (the managed objects are
    // counted then): the restart is over.
    let addr = f
        .agent_metrics_addr("node-1")
        .ok_or_else(|| anyhow::anyhow!("no metrics address"))?;
    f.eventually(
        T,
        "node-1's restarted agent's first drift check",
        || async {
            match metric_at(addr, "netwave_agent_managed_objects").await {
                Ok(m) if m > 0.0 => Ok(()),
                r => Err(format!("{r:?}")),
            }
        },
    )
    .await?;
    rows.push(window(
        &mut probe,
        "agent on node-1 killed and restarted",
        t,
        |_| false,
    ));

    // 6. FRR edited behind the agent's back on node-0, then the agent restarted: its first drift check
    // reloads FRR with the EVPN config unchanged (only the stray prefix list goes).
    let t = Instant::now();
    f.frr("node-0")
        .ok_or_else(|| anyhow::anyhow!("no FRR on node-0"))?
        .vtysh(&[
            "-c",
            "configure terminal",
            "-c",
            "ip prefix-list hitless-stray seq 5 permit 192.0.2.0/24",
        ])?;
    f.kill_agent("node-0");
    f.start_agent("node-0")?;
    f.eventually(
        T,
        "node-0's agent removed the stray prefix list",
        || async {
            let running = f
                .frr("node-0")
                .ok_or("no FRR")?
                .running()
                .map_err(|e| e.to_string())?;
            (!running.contains("hitless-stray"))
                .then_some(())
                .ok_or_else(|| "still there".to_string())
        },
    )
    .await?;
    rows.push(window(
        &mut probe,
        "FRR reloaded, EVPN config unchanged",
        t,
        |_| false,
    ));

    // 7. A Node label change that re-renders one node: node-1 joins a segment selected by label.
    let t = Instant::now();
    f.create_layer2(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "Layer2NetworkConfiguration",
        "metadata": {"name": "vlan130-labelled"},
        "spec": {"id": 130, "vni": 1000130, "mtu": 1500,
                 "nodeSelector": {"matchLabels": {"hitless.netwave.dev/extra": "yes"}}},
    }))
    .await?;
    seq = settle(f, seq, "Complete").await?;
    rows.push(window(
        &mut probe,
        "add a segment no node selects yet",
        t,
        |_| false,
    ));
    let t = Instant::now();
    kube::Api::<k8s_openapi::api::core::v1::Node>::all(f.client.clone())
        .patch(
            "node-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"hitless.netwave.dev/extra": "yes"}}}),
            ),
        )
        .await?;
    f.eventually(T, "node-1 runs VLAN 130", || async {
        let state = f.kernel_state("node-1").map_err(|e| e.to_string())?;
        state
            .contains("l2.130")
            .then_some(())
            .ok_or_else(|| "no l2.130 yet".to_string())
    })
    .await?;
    rows.push(window(
        &mut probe,
        "node-1 relabelled: joins VLAN 130",
        t,
        |_| false,
    ));

    // 8. A revision that fails on node-2 (its health probe target blackholed) and is rolled back there.
    let t = Instant::now();
    f.create_routing_table(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "hitless-bad"},
        "spec": {
            "tableId": 300,
            "routes": [{"prefix": format!("{PROBE_TARGET}/32"), "type": "blackhole"}],
            "rules": [{"to": format!("{PROBE_TARGET}/32"), "priority": 300}],
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "node-2"}},
        }
    }))
    .await?;
    f.wait_latest(seq, &["Failed"], T).await?;
    let good = f
        .revisions()
        .await?
        .into_iter()
        .rfind(|r| r.spec.sequence <= seq && netwave_e2e::fleet::phase(r) == "Complete")
        .and_then(|r| r.metadata.name)
        .unwrap_or_default();
    f.wait_all_on(&good, T).await?;
    rows.push(window(
        &mut probe,
        "failed revision rolled back on node-2",
        t,
        |_| false,
    ));
    Ok(rows)
}

/// Waits until the newest revision after `seq` is in `phase` and every node runs it; returns its
/// sequence.
async fn settle(f: &Fleet, seq: u64, phase: &str) -> anyhow::Result<u64> {
    let r = f.wait_latest(seq, &[phase], T).await?;
    f.wait_all_on(r.metadata.name.as_deref().unwrap_or_default(), T)
        .await?;
    Ok(r.spec.sequence)
}

fn window(
    probe: &mut Probe,
    scenario: &str,
    started: Instant,
    touched: impl Fn(&str) -> bool,
) -> Row {
    let flows = probe
        .window()
        .into_iter()
        .map(|(name, s)| {
            let t = touched(&name);
            (name, s, t)
        })
        .collect();
    (scenario.to_string(), flows, started.elapsed())
}
