//! End to end with a real BGP EVPN control plane: every node namespace runs its own FRR (zebra + bgpd,
//! iBGP full mesh over the fabric), the agents configure it through `--frr-config`, and the harness
//! installs no VXLAN flood entries. Needs root and FRR (`frr frr-pythontools`); skips loudly otherwise.
//!
//! ```text
//!  node-i ns: eth0 198.18.0.(i+1) ── zebra+bgpd ◄─ agent (--frr-config) ── l2.103/vx.103 ── wl0 ─ workload
//!  EVPN: type-3 (IMET) → `00:00:00:00:00:00 dst <peer>` on vx.103; type-2 → remote MACs `extern_learn`
//! ```
//!
//! Cleanup: the fleet stops every FRR daemon by pid before it deletes the namespaces, also on panic.

use netwave_api::vocab::{NodeReason, RevisionPhase};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use netwave_api::AnyInput;
use netwave_api::manifest::{Manifest, samples};
use netwave_e2e::fleet::{Bins, DATA_VLAN, Fleet, FleetOptions};
use netwave_e2e::netns::{is_root, namespaces_of, ping_in};
use serde_json::json;

const T: Duration = Duration::from_secs(120);
/// The data segment's VNI in the samples (`vlan103-monitoring`).
const DATA_VNI: u32 = 1_000_103;
/// The segment the second revision adds.
const NEW_VLAN: u16 = 120;
const NEW_VNI: u32 = 1_000_120;

fn bins() -> Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| Bins::build().expect("netwave binaries build"))
        .clone()
}

fn skip() -> bool {
    if !is_root() {
        eprintln!(
            "SKIPPED: the EVPN end-to-end test needs root (network namespaces, netlink, FRR)"
        );
        return true;
    }
    if !netwave_control_plane::frr::installed() {
        eprintln!(
            "SKIPPED: the EVPN end-to-end test needs FRR: {}",
            netwave_control_plane::frr::INSTALL
        );
        return true;
    }
    false
}

fn new_segment() -> Manifest {
    Manifest::Input(AnyInput::Layer2(
        serde_json::from_value(json!({
            "apiVersion": "netwave.dev/v1alpha1",
            "kind": "Layer2NetworkConfiguration",
            "metadata": {"name": "vlan120-evpn-added"},
            "spec": {
                "id": NEW_VLAN,
                "vni": NEW_VNI,
                "mtu": 9000,
                "anycastMac": "02:00:5e:00:01:20",
                "anycastGateways": ["10.250.20.1/24"],
            }
        }))
        .unwrap(),
    ))
}

/// `ip -j link show eth0` in namespace `ns`: its MAC.
fn mac_of(ns: &str) -> String {
    let out = netwave_e2e::netns::ip(&["-n", ns, "-j", "link", "show", "eth0"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["address"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evpn_installs_the_flood_entries_pings_cross_nodes_and_a_new_segment_reaches_each_nodes_frr()
 {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    let test_start = Instant::now();
    let mut f = Fleet::start(
        bins(),
        FleetOptions {
            nodes: 3,
            max_unavailable: 1,
            frr: true,
            ..FleetOptions::default()
        },
    )
    .await
    .expect("fleet with FRR starts");
    let frr_started = f.frr_started.expect("FRR started");
    let nodes = f.node_names();
    let pids: Vec<u32> = nodes
        .iter()
        .flat_map(|n| f.frr(n).unwrap().pids())
        .map(|(_, p)| p)
        .collect();
    assert_eq!(pids.len(), 6, "zebra + bgpd on each of 3 nodes");
    assert!(
        f.install_flood_entries().is_err(),
        "with FRR the harness must not install flood entries"
    );

    // Revision 1: the samples (on unpooled nodes: the default-VRF segments, vlan103 among them).
    let t = Instant::now();
    f.apply(&samples().unwrap()).await.unwrap();
    let rev1 = f
        .wait_latest(0, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    let rollout1 = t.elapsed();
    let seq1 = rev1.spec.sequence;
    let rev1 = rev1.metadata.name.unwrap();

    // Every node's zebra has the data VNI, and its vx.103 gets one flood entry per peer VTEP from
    // EVPN type-3 routes (nobody else installs any).
    let vx = format!("vx.{DATA_VLAN}");
    for n in &nodes {
        let fr = f.frr(n).unwrap();
        let vnis = fr.evpn_vnis().unwrap();
        assert!(vnis.contains(&DATA_VNI), "{n}: show evpn vni {vnis:?}");
    }
    let underlay: BTreeMap<String, String> = f
        .net
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.underlay.to_string()))
        .collect();
    f.eventually(T, "EVPN flood entries for every peer VTEP", || async {
        for n in &nodes {
            let fdb = f.fdb(n, &vx).map_err(|e| e.to_string())?;
            for (peer, addr) in &underlay {
                if peer == n {
                    continue;
                }
                if !fdb.iter().any(|l| {
                    l.starts_with("00:00:00:00:00:00 ") && l.contains(&format!("dst {addr} "))
                }) {
                    return Err(format!("{n}: no flood entry for {peer} ({addr}): {fdb:?}"));
                }
            }
        }
        Ok(())
    })
    .await
    .unwrap();
    let flood_at = frr_started.elapsed();
    // zebra's view agrees: each node lists the two others as remote VTEPs of the data VNI.
    for n in &nodes {
        let out = f
            .frr(n)
            .unwrap()
            .vtysh(&["-c", &format!("show evpn vni {DATA_VNI} json")])
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        // FRR 8.4 names the list of remote VTEPs `numRemoteVteps`.
        let mut remote: Vec<&str> = v["numRemoteVteps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str())
            .collect();
        remote.sort();
        let mut want: Vec<&str> = underlay
            .iter()
            .filter(|(p, _)| *p != n)
            .map(|(_, a)| a.as_str())
            .collect();
        want.sort();
        assert_eq!(remote, want, "{n}: remote VTEPs of {DATA_VNI}: {out}");
    }

    // Data plane: a workload per node on vlan103; each pings the next node's workload over VXLAN.
    let workloads = f.add_workloads().unwrap();
    let mut first_ping = None;
    for (i, (node, ns, _)) in workloads.iter().enumerate() {
        let (peer, _, peer_addr) = &workloads[(i + 1) % workloads.len()];
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ok = false;
        while !ok && Instant::now() < deadline {
            ok = ping_in(ns, peer_addr);
        }
        assert!(ok, "{node} → {peer} ({peer_addr}) over {vx}");
        first_ping.get_or_insert(frr_started.elapsed());
    }
    let first_ping = first_ping.unwrap();
    // Type-2: node-0 learnt node-1's workload MAC through EVPN (zebra installs it `extern_learn`, with the
    // remote VTEP as its destination), not by flooding and learning (the VXLAN device has learning off).
    let (_, ns1, _) = &workloads[1];
    let mac1 = mac_of(ns1);
    let vtep1 = &underlay[&workloads[1].0];
    f.eventually(
        T,
        "node-1's workload MAC learnt by EVPN on node-0",
        || async {
            let fdb = f.fdb(&nodes[0], &vx).map_err(|e| e.to_string())?;
            fdb.iter()
                .find(|l| {
                    l.starts_with(&mac1)
                        && l.contains(&format!("dst {vtep1} "))
                        && l.contains("extern_learn")
                })
                .cloned()
                .ok_or_else(|| format!("no extern_learn entry for {mac1} dst {vtep1}: {fdb:?}"))
        },
    )
    .await
    .unwrap();

    // Revision 2 adds a segment; one node at a time (maxUnavailable 1). Sampled while it rolls: FRR lists
    // the new VNI only on nodes whose NodeNetworkConfig already carries the new revision (FRR read first,
    // so a node that gets it between the two reads cannot fail this), until every node lists it and is
    // Provisioned; the VNI must not appear everywhere at the same moment.
    let t = Instant::now();
    f.apply(&[new_segment()]).await.unwrap();
    let rev2 = f.wait_new_revision(seq1, T).await.unwrap();
    let rev2 = rev2.metadata.name.unwrap();
    assert_ne!(rev1, rev2);
    let mut provisioned: BTreeMap<String, Duration> = BTreeMap::new();
    let mut listed: BTreeMap<String, Duration> = BTreeMap::new();
    let what = format!("every node provisioned on {rev2} with VNI {NEW_VNI} in FRR");
    netwave_control_plane::poll::until(&what, T, async || {
        if listed.len() == nodes.len() && provisioned.len() == nodes.len() {
            return Ok(Ok(()));
        }
        let mut has: BTreeMap<String, bool> = BTreeMap::new();
        for n in &nodes {
            let vnis = f.frr(n).unwrap().evpn_vnis().unwrap();
            has.insert(n.clone(), vnis.contains(&NEW_VNI));
        }
        let configs = f.configs().await.unwrap();
        for n in &nodes {
            let c = &configs[n];
            if has[n] {
                assert_eq!(
                    c.spec.revision, rev2,
                    "{n}'s FRR lists {NEW_VNI} before its config carries {rev2}"
                );
                listed.entry(n.clone()).or_insert(t.elapsed());
            }
            if netwave_e2e::fleet::provisioned_on(c, &rev2) {
                provisioned.entry(n.clone()).or_insert(t.elapsed());
            }
        }
        Ok(Err(format!(
            "provisioned {provisioned:?}, VNI listed {listed:?}"
        )))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", f.logs_tail(10)));
    f.wait_phase(&rev2, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    let rollout2 = t.elapsed();
    let mut order: Vec<(&Duration, &String)> = listed.iter().map(|(n, d)| (d, n)).collect();
    order.sort();
    let first = *order[0].0;
    let last = *order[order.len() - 1].0;
    assert!(
        last > first,
        "node by node: the VNI appeared on every node at once: {listed:?}"
    );

    println!(
        "EVPN e2e (3 nodes, real FRR per node): FRR start → flood entries on all nodes {:.2}s, \
         → first ping {:.2}s (includes the samples rollout); samples rollout {:.2}s; \
         new segment rollout {:.2}s, VNI {NEW_VNI} listed in FRR at {:?}, provisioned at {:?}",
        flood_at.as_secs_f64(),
        first_ping.as_secs_f64(),
        rollout1.as_secs_f64(),
        rollout2.as_secs_f64(),
        listed,
        provisioned,
    );

    let run = f.net.run_id.clone();
    drop(f);
    assert_eq!(namespaces_of(&run), Vec::<String>::new(), "namespaces left");
    let alive: Vec<u32> = pids
        .into_iter()
        .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
        .collect();
    assert!(alive.is_empty(), "FRR daemons left running: {alive:?}");
    println!(
        "EVPN e2e test took {:.1}s",
        test_start.elapsed().as_secs_f64()
    );
}

/// `show bgp summary json` of `node`'s FRR: the peers whose session is Established.
fn established(f: &Fleet, node: &str) -> Vec<String> {
    let out = f
        .frr(node)
        .unwrap()
        .vtysh(&["-c", "show bgp summary json"])
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let mut up: Vec<String> = v["ipv4Unicast"]["peers"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, p)| p["state"] == "Established")
        .map(|(a, _)| a.clone())
        .collect();
    up.sort();
    up
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_that_breaks_a_nodes_bgp_session_is_rolled_back_there_and_fails_fleet_wide() {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    let test_start = Instant::now();
    let mut f = Fleet::start(
        bins(),
        FleetOptions {
            nodes: 2,
            max_unavailable: 1,
            frr: true,
            // Probing starts after FRR's hold time (9 s): a broken session is Established until then.
            settle_secs: 10.0,
            ..FleetOptions::default()
        },
    )
    .await
    .expect("fleet with FRR starts");
    let nodes = f.node_names();
    let underlay: BTreeMap<String, String> = f
        .net
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.underlay.to_string()))
        .collect();
    // Every agent gates on its BGP sessions: one health file for both, listing both underlay
    // addresses (a node's own is no neighbour of its FRR, so that probe never passes and never gates).
    let health = f.dir.join("health.yaml");
    let mut text = std::fs::read_to_string(&health).unwrap();
    let peers: Vec<String> = underlay.values().map(|a| format!("\"{a}\"")).collect();
    text.push_str(&format!("bgpPeers: [{}]\n", peers.join(", ")));
    std::fs::write(&health, text).unwrap();
    for n in &nodes {
        f.kill_agent(n);
        f.start_agent(n).unwrap();
    }

    // Revision 1: the samples. Before it FRR had no BGP at all, so no session gates its apply.
    f.apply(&samples().unwrap()).await.unwrap();
    let rev1 = f
        .wait_latest(0, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    let seq1 = rev1.spec.sequence;
    let rev1 = rev1.metadata.name.unwrap();
    f.eventually(T, "iBGP sessions Established on both nodes", || async {
        for n in &nodes {
            let want: Vec<String> = underlay
                .iter()
                .filter(|(p, _)| *p != n)
                .map(|(_, a)| a.clone())
                .collect();
            let up = established(&f, n);
            if up != want {
                return Err(format!("{n}: Established {up:?}, want {want:?}"));
            }
        }
        Ok(())
    })
    .await
    .unwrap();

    // Revision 2 sends traffic to every node's underlay address into a table that blackholes it (a
    // node's own address is delivered by the local table first): the first node that applies it loses
    // its session, reports Invalid naming the BGP probe and restores revision 1; the revision fails
    // and no other node applies it.
    let (mut routes, mut rules) = (Vec::new(), Vec::new());
    for (i, a) in underlay.values().enumerate() {
        routes.push(json!({"prefix": format!("{a}/32"), "type": "blackhole"}));
        rules.push(json!({"to": format!("{a}/32"), "priority": 100 + i}));
    }
    f.create_routing_table(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "cut-the-underlay"},
        "spec": {"tableId": 4242, "routes": routes, "rules": rules},
    }))
    .await
    .unwrap();
    let t = Instant::now();
    let rev2 = f.wait_new_revision(seq1, T).await.unwrap();
    let rev2 = rev2.metadata.name.unwrap();
    let failed = f
        .wait_phase(&rev2, &[RevisionPhase::Failed], T)
        .await
        .unwrap();
    let failed_after = t.elapsed();
    let status = failed.status.clone().unwrap_or_default();
    assert_eq!(status.failed_nodes.len(), 1, "{status:?}");
    let bad = status.failed_nodes[0].node.clone();
    let other = nodes.iter().find(|n| **n != bad).unwrap().clone();
    // The node's own status moves on (back on revision 1); the revision keeps what it reported.
    let message = status.failed_nodes[0].message.clone();
    assert_eq!(
        status.failed_nodes[0].reason,
        NodeReason::HealthCheckFailed.as_str(),
        "{message}"
    );
    assert!(
        message.starts_with(&format!("HealthCheckFailed: bgp {}", underlay[&other])),
        "{message}"
    );
    assert!(message.contains("not Established"), "{message}");
    assert!(
        !netwave_e2e::netns::ip(&["-n", &f.net.node(&bad).unwrap().netns, "rule"])
            .unwrap()
            .contains("4242"),
        "{bad} kept the rules of the failed revision after its rollback"
    );
    // Fleet-wide: both nodes end up on revision 1, and the sessions come back.
    f.wait_all_on(&rev1, T).await.unwrap();
    f.eventually(T, "iBGP sessions Established again", || async {
        for n in &nodes {
            if established(&f, n).len() != 1 {
                return Err(format!("{n}: Established {:?}", established(&f, n)));
            }
        }
        Ok(())
    })
    .await
    .unwrap();
    let recovered = t.elapsed();
    println!(
        "BGP gating e2e (2 nodes): {rev2} failed on {bad} after {:.1}s ('{message}'), every node \
         back on {rev1} with its sessions Established after {:.1}s",
        failed_after.as_secs_f64(),
        recovered.as_secs_f64()
    );
    let run = f.net.run_id.clone();
    drop(f);
    assert_eq!(namespaces_of(&run), Vec::<String>::new(), "namespaces left");
    println!(
        "BGP gating e2e took {:.1}s",
        test_start.elapsed().as_secs_f64()
    );
}
