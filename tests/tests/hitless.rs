//! Hitless apply (#31): traffic a change is not about loses nothing while netwave applies it.
//!
//! A 3-node fleet with real FRR (BGP EVPN installs the flood entries) runs the samples; workloads on two
//! default-VRF segments send UDP at 100 packets/s each (`netwave_e2e::probe`): two flows across VLAN 103,
//! one across VLAN 111, one routed from 103 to 111 through the anycast gateways. Each scenario makes one
//! change, waits until the fleet has finished with it, and reads every flow's losses, reorders and longest
//! gap over that window. Flows the change does not touch must lose nothing; the changed ones' figures
//! are printed (the table `make bench` and the closing note quote).
//!
//! Two more things a change must leave alone, read at each scenario's end:
//! - **Links.** Every node's ifindex per link: a link deleted and created again gets a new one. Only a
//!   change of identity the kernel cannot make in place (a VXLAN device's VNI) may recreate its link.
//! - **BGP.** The peers' UPDATE counters and every type-3/type-5 path's last-update time: a change that
//!   leaves the EVPN config as it is (an agent restart, an FRR reload) sends no UPDATE at all, and no
//!   change withdraws and re-advertises a path that stays.
//!
//! The last scenario is a new agent release whose rendering differs (#46's benign upgrade): the agents
//! are replaced one by one, each applies its difference under the health gate, no flow loses a packet.

use anyhow::Context;
use netwave_api::vocab::RevisionPhase;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use netwave_api::manifest::samples;
use netwave_e2e::fleet::{Bins, Fleet, FleetOptions, PROBE_TARGET};
use netwave_e2e::install::metric_at;
use netwave_e2e::netns::is_root;
use netwave_e2e::probe::{Flow, FlowStats, Probe};
use serde_json::json;

const T: Duration = Duration::from_secs(120);

/// One scenario's result: its name, each flow's figures with whether the change touches the flow, the
/// time it took to settle, and what BGP saw meanwhile.
struct Row {
    scenario: String,
    flows: Vec<(String, FlowStats, bool)>,
    took: Duration,
    bgp: Churn,
    /// "node link" of the links deleted and created again meanwhile.
    recreated: Vec<String>,
    /// The links the change may recreate (it changes their identity).
    may_recreate: Vec<String>,
}

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
    for row in &rows {
        for (flow, s, touched) in &row.flows {
            println!(
                "{:<44} {:<22} {:>6} {:>5} {:>9} {:>7.0}ms  {}",
                format!("{} ({:.1} s)", row.scenario, row.took.as_secs_f64()),
                flow,
                s.sent,
                s.lost,
                s.reordered,
                s.longest_gap.as_secs_f64() * 1000.0,
                if *touched { "yes" } else { "no" }
            );
            if !touched && s.lost > 0 {
                broken.push(format!(
                    "{}: {flow} lost {} of {}",
                    row.scenario, s.lost, s.sent
                ));
            }
        }
    }
    println!(
        "\nBGP EVPN at the peers during each change: UPDATE messages received, type-3/type-5 paths that \
         stayed, and of those the ones withdrawn and learned again"
    );
    println!(
        "{:<44} {:>8} {:>7} {:>10} {:>9}",
        "scenario", "updates", "stayed", "relearned", "touched"
    );
    for row in &rows {
        let c = &row.bgp;
        println!(
            "{:<44} {:>8} {:>7} {:>10} {:>9}",
            row.scenario,
            c.updates,
            c.stayed,
            c.relearned.len(),
            c.relearned_touched
        );
        for path in &c.relearned {
            broken.push(format!(
                "{}: BGP withdrew and re-learned {path}",
                row.scenario
            ));
        }
        if c.quiet && c.updates > 0 {
            broken.push(format!(
                "{}: the peers received {} BGP UPDATE messages; the change leaves EVPN as it is",
                row.scenario, c.updates
            ));
        }
    }
    println!("\nlinks deleted and created again during each change");
    for row in &rows {
        println!("{:<44} {}", row.scenario, row.recreated.join(", "));
        for link in &row.recreated {
            let allowed = row
                .may_recreate
                .iter()
                .any(|l| link.split(' ').nth(1) == Some(l.as_str()));
            if !allowed {
                broken.push(format!(
                    "{}: {link} was deleted and created again",
                    row.scenario
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "the changes disturbed what they are not about:\n{}",
        broken.join("\n")
    );
}

async fn run(f: &mut Fleet) -> anyhow::Result<Vec<Row>> {
    f.apply(&samples()?).await?;
    let first = f.wait_latest(0, &[RevisionPhase::Complete], T).await?;
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
    // Each workload announces itself, as a booting host does, so that its node's gateway knows it and
    // EVPN carries it to the other nodes: the routed flow towards node-0 starts only then (the
    // gateways share one anycast MAC). EVPN has the remote VTEPs within seconds of the rollout; the
    // probe waits for each flow's first packet.
    for (ns, gateway) in (w103.iter().map(|w| (&w.1, "10.250.3.1")))
        .chain(w111.iter().map(|w| (&w.0, "10.250.11.1")))
    {
        netwave_e2e::netns::announce(ns, gateway);
    }
    let mut w = Watch::start(f, flows)?;
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
    seq = settle(f, seq, RevisionPhase::Complete).await?;
    rows.push(
        w.close(
            f,
            "add a segment (VLAN 120)",
            t,
            |_| false,
            Evpn::Untouched,
            &[],
        )
        .await?,
    );

    // 2. A route in a routing table.
    let t = Instant::now();
    f.create_routing_table(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "hitless-extra"},
        "spec": {"tableId": 310, "routes": [{"prefix": "198.18.250.0/24", "type": "blackhole"}]},
    }))
    .await?;
    seq = settle(f, seq, RevisionPhase::Complete).await?;
    rows.push(
        w.close(
            f,
            "add a routing table with a route",
            t,
            |_| false,
            Evpn::Untouched,
            &[],
        )
        .await?,
    );

    // 3. One segment's MTU: only its own flows may notice.
    let t = Instant::now();
    f.patch_layer2("vlan111-pxe", json!({"mtu": 1400})).await?;
    seq = settle(f, seq, RevisionPhase::Complete).await?;
    rows.push(
        w.close(
            f,
            "change VLAN 111's MTU",
            t,
            touches_111,
            Evpn::Untouched,
            &[],
        )
        .await?,
    );

    // 4. The segment of step 1 removed again.
    let t = Instant::now();
    f.delete_layer2("vlan120-new").await?;
    seq = settle(f, seq, RevisionPhase::Complete).await?;
    rows.push(
        w.close(
            f,
            "remove a segment (VLAN 120)",
            t,
            |_| false,
            Evpn::Untouched,
            &[],
        )
        .await?,
    );

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
    rows.push(
        w.close(
            f,
            "agent on node-1 killed and restarted",
            t,
            |_| false,
            Evpn::Unchanged,
            &[],
        )
        .await?,
    );

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
    rows.push(
        w.close(
            f,
            "FRR reloaded, EVPN config unchanged",
            t,
            |_| false,
            Evpn::Unchanged,
            &[],
        )
        .await?,
    );

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
    seq = settle(f, seq, RevisionPhase::Complete).await?;
    rows.push(
        w.close(
            f,
            "add a segment no node selects yet",
            t,
            |_| false,
            Evpn::Unchanged,
            &[],
        )
        .await?,
    );
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
    rows.push(
        w.close(
            f,
            "node-1 relabelled: joins VLAN 130",
            t,
            |_| false,
            Evpn::Untouched,
            &[],
        )
        .await?,
    );

    // 8. VLAN 111's VNI changed: the kernel cannot change a VXLAN device's VNI, so each node recreates
    // vx.111 (and only it); 111's flows break while the nodes disagree on the VNI, the others must not.
    let t = Instant::now();
    f.patch_layer2("vlan111-pxe", json!({"vni": 1000911}))
        .await?;
    seq = settle(f, seq, RevisionPhase::Complete).await?;
    rows.push(
        w.close(
            f,
            "change VLAN 111's VNI",
            t,
            touches_111,
            Evpn::Vni(&[1000111, 1000911]),
            &["vx.111"],
        )
        .await?,
    );

    // 9. A revision that fails on node-2 (its health probe target blackholed) and is rolled back there.
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
    f.wait_latest(seq, &[RevisionPhase::Failed], T).await?;
    let good = f
        .revisions()
        .await?
        .into_iter()
        .rfind(|r| {
            r.spec.sequence <= seq
                && netwave_e2e::fleet::phase(r) == RevisionPhase::Complete.as_str()
        })
        .and_then(|r| r.metadata.name)
        .unwrap_or_default();
    f.wait_all_on(&good, T).await?;
    rows.push(
        w.close(
            f,
            "failed revision rolled back on node-2",
            t,
            |_| false,
            Evpn::Untouched,
            &[],
        )
        .await?,
    );

    // 10. A new agent release whose rendering differs, benignly (#46): the test-only rendering drill adds
    // one blackhole route no flow or probe uses. Agents are replaced one node after another, as the
    // DaemonSet does; each applies the difference under the health gate before it is ready.
    let t = Instant::now();
    let drill = format!("blackhole:{BENIGN}/32");
    for node in f.node_names() {
        f.kill_agent(&node);
        f.start_agent_with(&node, &[("NETWAVE_RENDERING_DRILL", drill.as_str())])?;
        let addr = f.agent_metrics_addr(&node).context("no metrics address")?;
        let netns = f.net.node(&node).context("no such node")?.netns.clone();
        f.eventually(
            T,
            &format!("{node}'s new agent passed the gate"),
            || async {
                let applied = metric_at(addr, "netwave_agent_upgrade_applies_total")
                    .await
                    .map_err(|e| e.to_string())?;
                let routes = netwave_e2e::netns::ip(&[
                    "-n",
                    &netns,
                    "route",
                    "show",
                    &format!("{BENIGN}/32"),
                ])
                .map_err(|e| e.to_string())?;
                (applied == 1.0 && routes.contains("blackhole"))
                    .then_some(())
                    .ok_or_else(|| format!("upgrade applies {applied}, route: {routes:?}"))
            },
        )
        .await?;
    }
    rows.push(
        w.close(
            f,
            "agent release with a benign rendering change",
            t,
            |_| false,
            Evpn::Unchanged,
            &[],
        )
        .await?,
    );
    Ok(rows)
}

/// The route the benign rendering drill adds: in the test range, used by no node, flow or probe.
const BENIGN: &str = "198.19.254.1";

/// Waits until the newest revision after `seq` is in `phase` and every node runs it; returns its
/// sequence.
async fn settle(f: &Fleet, seq: u64, phase: RevisionPhase) -> anyhow::Result<u64> {
    let r = f.wait_latest(seq, &[phase], T).await?;
    f.wait_all_on(r.metadata.name.as_deref().unwrap_or_default(), T)
        .await?;
    Ok(r.spec.sequence)
}

/// The probe and what the peers' BGP had learned when the last scenario ended.
struct Watch {
    probe: Probe,
    bgp: Bgp,
    /// "node link" → ifindex: a link deleted and created again has a new one.
    links: BTreeMap<String, u64>,
}

/// What a scenario's change may do to the EVPN routes the nodes exchange.
enum Evpn<'a> {
    /// Nothing: no node's FRR config changes, so no peer may receive a single UPDATE.
    Unchanged,
    /// Routes come and go, but a type-3 or type-5 path that stays is never withdrawn and re-advertised.
    Untouched,
    /// As `Untouched`, except the paths of these VNIs (their route targets).
    Vni(&'a [u32]),
}

impl Watch {
    fn start(f: &Fleet, flows: Vec<Flow>) -> anyhow::Result<Watch> {
        let mut probe = Probe::start(flows, 100)?;
        let _ = probe.window();
        Ok(Watch {
            probe,
            bgp: Bgp::read(f)?,
            links: links(f)?,
        })
    }

    /// Ends a scenario: once BGP is quiet, every flow's figures since the last call and the peers' view
    /// compared with the one at its start.
    async fn close(
        &mut self,
        f: &Fleet,
        scenario: &str,
        started: Instant,
        touched: impl Fn(&str) -> bool,
        evpn: Evpn<'_>,
        recreates: &[&str],
    ) -> anyhow::Result<Row> {
        let took = started.elapsed();
        let bgp = Bgp::quiet(f).await?;
        let flows = self
            .probe
            .window()
            .into_iter()
            .map(|(name, s)| {
                let t = touched(&name);
                (name, s, t)
            })
            .collect();
        let churn = self.bgp.churn(&bgp, &evpn);
        self.bgp = bgp;
        let now = links(f)?;
        let recreated = self
            .links
            .iter()
            .filter(|(link, index)| now.get(*link).is_some_and(|i| i != *index))
            .map(|(link, _)| link.clone())
            .collect();
        self.links = now;
        Ok(Row {
            scenario: scenario.to_string(),
            flows,
            took,
            bgp: churn,
            recreated,
            may_recreate: recreates.iter().map(|l| l.to_string()).collect(),
        })
    }
}

/// Every node's BGP view of its peers: each EVPN path learned from a peer with the second it was last
/// updated and its extended communities, and the UPDATE messages received from all peers.
#[derive(PartialEq)]
struct Bgp {
    /// "node rd prefix from peer" → (last update, epoch seconds; extended communities).
    paths: BTreeMap<String, (i64, String)>,
    updates: u64,
}

/// What BGP saw during one scenario.
#[derive(Default)]
struct Churn {
    /// UPDATE messages (advertisements and withdrawals) the peers received.
    updates: u64,
    /// Type-3 and type-5 paths present before and after.
    stayed: usize,
    /// Of those, the ones updated meanwhile that the change is not about.
    relearned: Vec<String>,
    /// Updated ones the change is about (`Evpn::Vni`).
    relearned_touched: usize,
    /// The change promised no UPDATE at all (`Evpn::Unchanged`).
    quiet: bool,
}

impl Bgp {
    fn read(f: &Fleet) -> anyhow::Result<Bgp> {
        let mut paths = BTreeMap::new();
        let mut updates = 0;
        for node in f.node_names() {
            let frr = f
                .frr(&node)
                .ok_or_else(|| anyhow::anyhow!("no FRR on {node}"))?;
            let neighbors: serde_json::Value =
                serde_json::from_str(&frr.vtysh(&["-c", "show bgp neighbors json"])?)?;
            for n in neighbors.as_object().into_iter().flat_map(|o| o.values()) {
                updates += n["messageStats"]["updatesRecv"].as_u64().unwrap_or(0);
            }
            let routes: serde_json::Value = serde_json::from_str(
                &frr.vtysh(&["-c", "show bgp l2vpn evpn route detail json"])?,
            )?;
            for (rd, prefixes) in routes.as_object().into_iter().flatten() {
                for (prefix, route) in prefixes.as_object().into_iter().flatten() {
                    for path in flat(&route["paths"]) {
                        let peer = path["peer"]["peerId"].as_str().unwrap_or_default();
                        let from_peer = peer
                            .parse::<std::net::IpAddr>()
                            .is_ok_and(|p| !p.is_unspecified());
                        if !from_peer {
                            continue; // the node's own route
                        }
                        paths.insert(
                            format!("{node} {rd} {prefix} from {peer}"),
                            (
                                path["lastUpdate"]["epoch"].as_i64().unwrap_or_default(),
                                path["extendedCommunity"]["string"]
                                    .as_str()
                                    .unwrap_or_default()
                                    .to_string(),
                            ),
                        );
                    }
                }
            }
        }
        Ok(Bgp { paths, updates })
    }

    /// The view once no peer has received an UPDATE for a second: a change's routes have propagated,
    /// and the next scenario starts from a still network.
    async fn quiet(f: &Fleet) -> anyhow::Result<Bgp> {
        let mut last = (Instant::now(), Bgp::read(f)?);
        netwave_control_plane::poll::until("BGP to go quiet for a second", T, async || {
            let now = Bgp::read(f)?;
            if now.updates != last.1.updates {
                last = (Instant::now(), now);
                return Ok(Err("UPDATEs still arriving".to_string()));
            }
            Ok(if last.0.elapsed() >= Duration::from_secs(1) {
                Ok(now)
            } else {
                Err("quiet for less than a second".to_string())
            })
        })
        .await
    }

    fn churn(&self, after: &Bgp, evpn: &Evpn<'_>) -> Churn {
        let mut c = Churn {
            updates: after.updates.saturating_sub(self.updates),
            quiet: matches!(evpn, Evpn::Unchanged),
            ..Churn::default()
        };
        for (key, (then, _)) in &self.paths {
            let Some((now, communities)) = after.paths.get(key) else {
                continue;
            };
            // Type-2 paths follow MAC learning in the data plane, not the config.
            if !(key.contains(" [3]:") || key.contains(" [5]:")) {
                continue;
            }
            c.stayed += 1;
            // FRR derives the epoch from the wall and the monotonic clock, which round apart by up to a
            // second; a path learned again is newer by the time since it was first learned.
            if now.abs_diff(*then) <= 1 {
                continue;
            }
            let about = match evpn {
                Evpn::Vni(vnis) => vnis.iter().any(|v| {
                    communities
                        .split(' ')
                        .any(|rt| rt.ends_with(&format!(":{v}")))
                }),
                _ => false,
            };
            if about {
                c.relearned_touched += 1;
            } else {
                c.relearned.push(key.clone());
            }
        }
        c
    }
}

/// Every node's links: "node link" → ifindex.
fn links(f: &Fleet) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut all = BTreeMap::new();
    for node in f.node_names() {
        let list: serde_json::Value =
            serde_json::from_str(&f.net.ip_in(&node, &["-j", "link", "show"])?)?;
        for l in list.as_array().into_iter().flatten() {
            if let (Some(name), Some(index)) = (l["ifname"].as_str(), l["ifindex"].as_u64()) {
                all.insert(format!("{node} {name}"), index);
            }
        }
    }
    Ok(all)
}

/// FRR's `paths`: a list of paths, or of lists of paths.
fn flat(v: &serde_json::Value) -> Vec<&serde_json::Value> {
    match v {
        serde_json::Value::Array(items) => items.iter().flat_map(flat).collect(),
        serde_json::Value::Object(_) => vec![v],
        _ => Vec::new(),
    }
}
