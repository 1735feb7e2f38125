//! The VRF path end to end on a full kernel: `tests/kernel-tier/fleet-vm.sh` boots Debian's cloud kernel
//! under qemu and runs these tests there, with the whole fleet inside the guest — node namespaces, the
//! API server, two configurators, an agent and FRR (zebra + bgpd, iBGP full mesh) per node. On a kernel
//! without VRF devices (the host's) they print `SKIPPED` and pass; inside the VM (`NETWAVE_KERNEL_TIER=1`)
//! a missing feature fails them, so the tier cannot go green by skipping.
//!
//! ```text
//!  node-0 (compute)                         node-1 (storage)                    node-2 (compute)
//!  vrf cluster (L3 VNI 2001000) ◄─ EVPN type-5 ─► vrf cluster                   vrf cluster
//!   ├ l2.100 ── w: 10.250.0.100       L2 VNI       ├ l2.100 ── w: 10.250.0.101
//!   ├ l2.130 ── w: 10.250.30.10     (node-0 only)  ├ l2.131 ── w: 10.250.31.10  (node-1 only)
//!   └ vlan.101 on trunk0 ── host behind the trunk, tagged 101: 10.250.1.50 ─► l2.101 w on node-1
//! ```

use netwave_api::vocab::RevisionPhase;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use netwave_api::manifest::{Manifest, samples};
use netwave_api::{AnyInput, InputKind, NetworkConfigRevision};
use netwave_e2e::fleet::{ApiServer, Bins, Fleet, FleetOptions, provisioned_on};
use netwave_e2e::netns::{ip, is_root, kernel_has_vrf, namespaces_of, ping_in};
use netwave_e2e::probe::{Flow, Probe};
use serde_json::{Value, json};

/// Generous: everything runs under software emulation inside the VM, whose speed follows the host's.
/// A hang still fails. On 2026-11-28 an FRR reload took 63 s per node, and VRF cluster's import-list
/// change (three nodes one after another) was still rolling at 300 s; earlier the same day it took
/// 221 s.
const T: Duration = Duration::from_secs(600);
const CLUSTER_VNI: u32 = 2_001_000;

fn skip() -> bool {
    let strict = std::env::var_os("NETWAVE_KERNEL_TIER").is_some_and(|v| v == "1");
    let why = if !is_root() {
        Some("needs root (network namespaces, netlink, FRR)".to_string())
    } else if !netwave_control_plane::frr::installed() {
        Some(format!(
            "needs FRR: {}",
            netwave_control_plane::frr::INSTALL
        ))
    } else if !kernel_has_vrf() {
        Some(
            "this kernel has no VRF devices (tests/kernel-tier/fleet-vm.sh runs it in a VM)".into(),
        )
    } else {
        None
    };
    match why {
        Some(why) if strict => panic!("the full-kernel fleet cannot run here: {why}"),
        Some(why) => {
            eprintln!("SKIPPED: the full-kernel fleet test {why}");
            true
        }
        None => false,
    }
}

fn manifest(v: Value) -> Manifest {
    let kind = v["kind"].as_str().and_then(InputKind::from_kind);
    let kind = kind.unwrap_or_else(|| panic!("no input kind {:?}", v["kind"]));
    Manifest::Input(AnyInput::from_value(kind, &v).unwrap())
}

/// A segment of the cluster VRF on one node only: traffic to it from another node must be routed
/// through the L3 VNI (nothing bridges it there).
fn single_node_segment(vlan: u16, node: &str) -> Manifest {
    manifest(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "Layer2NetworkConfiguration",
        "metadata": {"name": format!("vlan{vlan}-{node}")},
        "spec": {
            "id": vlan,
            "vni": 1_000_000 + u32::from(vlan),
            "mtu": 9000,
            "vrf": "cluster",
            "anycastMac": "02:00:5e:00:01:30",
            "anycastGateways": [format!("10.250.{}.1/24", vlan - 100)],
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        }
    }))
}

/// `ip -j -d link show <name>` in `ns`, or None when it does not exist.
fn link(ns: &str, name: &str) -> Option<Value> {
    let out = ip(&["-n", ns, "-j", "-d", "link", "show", name]).ok()?;
    let v: Value = serde_json::from_str(&out).ok()?;
    v.get(0).cloned()
}

async fn ping_eventually(f: &Fleet, from: &str, to: &str, what: &str) -> Duration {
    let t = Instant::now();
    f.eventually(T, what, || async {
        if ping_in(from, to) {
            Ok(())
        } else {
            Err(format!("no reply from {to}"))
        }
    })
    .await
    .unwrap();
    t.elapsed()
}

fn vrf_routes(f: &Fleet, node: &str, vrf: &str) -> String {
    f.frr(node)
        .unwrap()
        .vtysh(&["-c", &format!("show ip route vrf {vrf}")])
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_vrf_segments_route_through_the_l3_vni_leak_by_prefix_ride_a_trunk_and_a_bad_vrf_rolls_back()
 {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    let test_start = Instant::now();
    let mut f = Fleet::start(
        Bins::build().expect("netwave binaries"),
        FleetOptions {
            nodes: 3,
            max_unavailable: 1,
            frr: true,
            vlan_trunk: true,
            pools: Some(true),
            // The testbed starts in a second; kube-apiserver under emulation takes minutes. The API
            // server is not what this tier proves (tests/tests/rollout.rs runs on the real one).
            server: ApiServer::Testbed,
            health_deadline_secs: 30.0,
            apply_timeout: Duration::from_secs(240),
            ..FleetOptions::default()
        },
    )
    .await
    .expect("fleet with FRR starts");
    let fleet_up = test_start.elapsed();
    let nodes = f.node_names();
    let ns: BTreeMap<String, String> = f
        .net
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.netns.clone()))
        .collect();

    // 1. The samples' VRFs and segments, plus one cluster segment on node-0 only and one on node-1 only.
    let t = Instant::now();
    let mut inputs = samples().unwrap();
    inputs.push(single_node_segment(130, &nodes[0]));
    inputs.push(single_node_segment(131, &nodes[1]));
    f.apply(&inputs).await.unwrap();
    let rev1 = f
        .wait_latest(0, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    f.wait_all_on(rev1.metadata.name.as_deref().unwrap(), T)
        .await
        .unwrap();
    let rollout1 = t.elapsed();
    for n in &nodes {
        let vrf = link(&ns[n], "cluster").unwrap_or_else(|| panic!("{n}: no VRF device cluster"));
        assert_eq!(vrf["linkinfo"]["info_kind"], "vrf", "{n}: {vrf}");
        let l2 = link(&ns[n], "l2.100").unwrap_or_else(|| panic!("{n}: no l2.100"));
        assert_eq!(
            l2["master"], "cluster",
            "{n}: l2.100 is not in VRF cluster: {l2}"
        );
        let trunk_vlan = link(&ns[n], "vlan.101").unwrap_or_else(|| panic!("{n}: no vlan.101"));
        assert_eq!(
            trunk_vlan["linkinfo"]["info_data"]["id"], 101,
            "{n}: {trunk_vlan}"
        );
        assert_eq!(trunk_vlan["master"], "l2.101", "{n}: {trunk_vlan}");
    }
    // zebra knows the L3 VNI of VRF cluster on every node.
    for n in &nodes {
        let fr = f.frr(n).unwrap();
        f.eventually(T, "the cluster VRF's L3 VNI up in zebra", || async {
            let out = fr
                .vtysh(&["-c", &format!("show evpn vni {CLUSTER_VNI} json")])
                .map_err(|e| e.to_string())?;
            let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
            if v["type"] == "L3" && v["vrf"] == "cluster" && v["state"] == "Up" {
                Ok(())
            } else {
                Err(format!("{n}: {out}"))
            }
        })
        .await
        .unwrap();
    }

    // 2. L2 VNI inside the VRF: workloads of vlan100 on node-0 and node-1.
    let w0 = f
        .net
        .add_workload_on(&nodes[0], 1, "l2.100", "10.250.0.100/24", "10.250.0.1")
        .unwrap();
    let w1 = f
        .net
        .add_workload_on(&nodes[1], 1, "l2.100", "10.250.0.101/24", "10.250.0.1")
        .unwrap();
    let l2_ping = ping_eventually(&f, &w0, "10.250.0.101", "vlan100: node-0 → node-1").await;
    ping_eventually(&f, &w1, "10.250.0.100", "vlan100: node-1 → node-0").await;

    // 3. L3 VNI (symmetric IRB): vlan130 exists on node-0 only, vlan131 on node-1 only.
    let a = f
        .net
        .add_workload_on(&nodes[0], 2, "l2.130", "10.250.30.10/24", "10.250.30.1")
        .unwrap();
    let b = f
        .net
        .add_workload_on(&nodes[1], 2, "l2.131", "10.250.31.10/24", "10.250.31.1")
        .unwrap();
    let l3_ping = ping_eventually(
        &f,
        &a,
        "10.250.31.10",
        "vlan130 on node-0 → vlan131 on node-1",
    )
    .await;
    ping_eventually(
        &f,
        &b,
        "10.250.30.10",
        "vlan131 on node-1 → vlan130 on node-0",
    )
    .await;
    let routes = vrf_routes(&f, &nodes[0], "cluster");
    assert!(
        routes
            .lines()
            .any(|l| l.contains("10.250.31.") && l.starts_with('B')),
        "node-0 learnt node-1's vlan131 through BGP EVPN in VRF cluster:\n{routes}"
    );
    assert!(
        link(&ns[&nodes[0]], "l2.131").is_none(),
        "vlan131 must not exist on node-0 (the ping would be bridged, not routed)"
    );

    // 4. Leaking: the cluster VRF's import list lets 10.102.0.0/16 into the default VRF, except
    // 10.102.255.0/24 (a deny with a lower seq), and keeps what matches no item (10.103.7.0/24) out.
    let table = link(&ns[&nodes[0]], "cluster").unwrap()["linkinfo"]["info_data"]["table"]
        .as_u64()
        .expect("VRF table");
    for prefix in ["10.102.7.0/24", "10.102.255.0/24", "10.103.7.0/24"] {
        ip(&[
            "-n",
            &ns[&nodes[0]],
            "route",
            "add",
            "blackhole",
            prefix,
            "table",
            &table.to_string(),
        ])
        .unwrap();
    }
    let fr0 = f.frr(&nodes[0]).unwrap();
    f.eventually(
        T,
        "10.102.7.0/24 leaked from VRF cluster into the default VRF",
        || async {
            let out = fr0
                .vtysh(&["-c", "show ip route 10.102.7.0/24 json"])
                .map_err(|e| e.to_string())?;
            if out.contains("10.102.7.0/24") {
                Ok(())
            } else {
                Err(out)
            }
        },
    )
    .await
    .unwrap();
    for kept_out in ["10.102.255.0/24", "10.103.7.0/24"] {
        let shown = fr0
            .vtysh(&["-c", &format!("show ip route {kept_out} json")])
            .unwrap();
        assert!(
            !shown.contains(kept_out),
            "{kept_out} must not leak into the default VRF: {shown}"
        );
    }

    // 5. A host behind node-0's trunk tags its frames 101; vlan.101 carries them into segment vlan101,
    // whose L2 VNI takes them to a workload on node-1.
    let trunk_host = f.trunk_host(&nodes[0]).unwrap();
    ip(&[
        "-n",
        &trunk_host,
        "link",
        "add",
        "link",
        "eth0",
        "name",
        "eth0.101",
        "type",
        "vlan",
        "id",
        "101",
    ])
    .unwrap();
    ip(&[
        "-n",
        &trunk_host,
        "addr",
        "add",
        "10.250.1.50/24",
        "dev",
        "eth0.101",
    ])
    .unwrap();
    ip(&["-n", &trunk_host, "link", "set", "eth0.101", "up"]).unwrap();
    f.net
        .add_workload_on(&nodes[1], 3, "l2.101", "10.250.1.101/24", "10.250.1.1")
        .unwrap();
    let trunk_ping = ping_eventually(
        &f,
        &trunk_host,
        "10.250.1.101",
        "host behind node-0's trunk (VLAN 101) → vlan101 workload on node-1",
    )
    .await;

    // 5b. Hitless (#31): UDP at 100/s through the L2 VNI (vlan100) and the L3 VNI (vlan130 → vlan131)
    // while the cluster VRF's import list changes and while the bad VRF below is rolled back: neither
    // change is about these flows, so they lose nothing.
    let mut probe = Probe::start(
        vec![
            Flow {
                name: "vlan100 node-0→node-1 (L2 VNI)".into(),
                from: w0.clone(),
                to: w1.clone(),
                to_addr: "10.250.0.101".parse().unwrap(),
            },
            Flow {
                name: "vlan130→vlan131 (L3 VNI)".into(),
                from: a.clone(),
                to: b.clone(),
                to_addr: "10.250.31.10".parse().unwrap(),
            },
        ],
        100,
    )
    .unwrap();
    let _ = probe.window();
    let vrfs: kube::Api<netwave_api::VRFRouteConfiguration> = kube::Api::all(f.client.clone());
    let mut import = serde_json::to_value(&vrfs.get("cluster").await.unwrap().spec.import).unwrap();
    import
        .as_array_mut()
        .unwrap()
        .push(json!({"cidr": "10.104.0.0/16", "le": 32, "action": "permit"}));
    let t = Instant::now();
    vrfs.patch(
        "cluster",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"import": import}})),
    )
    .await
    .unwrap();
    let rev2 = f
        .wait_latest(rev1.spec.sequence, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    f.wait_all_on(rev2.metadata.name.as_deref().unwrap(), T)
        .await
        .unwrap();
    let import_change = t.elapsed();
    let mut hitless = Vec::new();
    for (flow, s) in probe.window() {
        println!(
            "hitless: VRF cluster's import list changed ({:.1} s): {flow}: {} sent, {} lost, longest gap \
             {:.0} ms",
            import_change.as_secs_f64(),
            s.sent,
            s.lost,
            s.longest_gap.as_secs_f64() * 1000.0
        );
        if s.lost > 0 {
            hitless.push(format!(
                "import list change: {flow} lost {} of {}",
                s.lost, s.sent
            ));
        }
    }
    // The import list's revision is the last good one now.
    let rev1 = rev2;
    let rev1_name = rev1.metadata.name.clone().unwrap();

    // 6. A bad VRF change: a new VRF whose device name node-1 already uses for a VRF of its own (not
    // netwave's). Node-1 refuses it, the rollout halts, touched nodes return to the last good revision
    // (kernel and FRR), and traffic through the L3 VNI still flows.
    ip(&[
        "-n",
        &ns[&nodes[1]],
        "link",
        "add",
        "tenantx",
        "type",
        "vrf",
        "table",
        "4711",
    ])
    .unwrap();
    let before: BTreeMap<String, String> = nodes
        .iter()
        .map(|n| (n.clone(), f.kernel_state(n).unwrap()))
        .collect();
    let t = Instant::now();
    f.apply(&[manifest(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "VRFRouteConfiguration",
        "metadata": {"name": "tenantx"},
        "spec": {
            "vrf": "tenantx",
            "vni": 2_005_000,
            "routeTarget": "65188:2005",
            "seq": 50,
            "import": [{"cidr": "10.140.0.0/16", "le": 32, "action": "permit"}],
            "export": [{"cidr": "10.250.40.0/24", "action": "permit"}],
            "nodeSelector": {"matchExpressions": [
                {"key": "node-restriction.kubernetes.io/netwave-pool", "operator": "Exists"}]},
        }
    }))])
    .await
    .unwrap();
    let failed: NetworkConfigRevision = f
        .wait_latest(rev1.spec.sequence, &[RevisionPhase::Failed], T)
        .await
        .unwrap();
    let st = failed.status.clone().unwrap();
    assert_eq!(st.failed_nodes[0].node, nodes[1], "{:?}", st.failed_nodes);
    assert!(
        st.failed_nodes[0].message.contains("tenantx"),
        "the failure names the conflicting device: {:?}",
        st.failed_nodes[0]
    );
    f.wait_all_on(&rev1_name, T).await.unwrap();
    let halted = t.elapsed();
    for n in &nodes {
        assert_eq!(
            f.kernel_state(n).unwrap(),
            before[n],
            "{n}: kernel back to {rev1_name}"
        );
        let running = f.frr(n).unwrap().running().unwrap();
        assert!(
            !running.contains("vrf tenantx"),
            "{n}: FRR still runs the failed VRF:\n{running}"
        );
    }
    let configs = f.configs().await.unwrap();
    for n in &nodes {
        assert!(
            provisioned_on(&configs[n], &rev1_name),
            "{n}: {:?}",
            configs[n].status
        );
    }
    ping_eventually(&f, &a, "10.250.31.10", "L3 VNI after the rollback").await;
    for (flow, s) in probe.window() {
        println!(
            "hitless: bad VRF tenantx rolled back on node-1: {flow}: {} sent, {} lost, longest gap {:.0} ms",
            s.sent,
            s.lost,
            s.longest_gap.as_secs_f64() * 1000.0
        );
        if s.lost > 0 {
            hitless.push(format!(
                "bad VRF rollback: {flow} lost {} of {}",
                s.lost, s.sent
            ));
        }
    }
    drop(probe);
    assert!(
        hitless.is_empty(),
        "flows the changes are not about lost packets:\n{}",
        hitless.join("\n")
    );

    println!(
        "full-kernel fleet (3 nodes, FRR per node, testbed API server): fleet up {:.1}s; samples + 2 \
         segments rolled out in {:.1}s; first ping L2 VNI {:.1}s, L3 VNI {:.1}s, trunk {:.1}s; bad VRF \
         halted and rolled back in {:.1}s; test {:.1}s",
        fleet_up.as_secs_f64(),
        rollout1.as_secs_f64(),
        l2_ping.as_secs_f64(),
        l3_ping.as_secs_f64(),
        trunk_ping.as_secs_f64(),
        halted.as_secs_f64(),
        test_start.elapsed().as_secs_f64(),
    );
    let run = f.net.run_id.clone();
    drop(f);
    assert_eq!(namespaces_of(&run), Vec::<String>::new(), "namespaces left");
}

/// BGP as a service (#29) in the VRF path: a BGP speaker (a second FRR bgpd, AS 65511, in a workload
/// namespace on node-0's segment vlan130 of VRF cluster) peers with node-0 through the listen range
/// the BGPPeering gives that segment; the prefix it announces (10.250.53.1/32, inside its import list)
/// reaches VRF cluster on node-1 through EVPN (type-5) and answers pings from there. The peering then
/// names another AS: node-0's session never comes up within the 9 s hold time, node-0 fails the
/// revision naming the peering, and is rolled back; the session and the route come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_bgp_peering_reaches_other_nodes_through_evpn_and_a_wrong_asn_rolls_back() {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    let test_start = Instant::now();
    let mut f = Fleet::start(
        Bins::build().expect("netwave binaries"),
        FleetOptions {
            nodes: 2,
            max_unavailable: 1,
            frr: true,
            pools: Some(true),
            server: ApiServer::Testbed,
            health_deadline_secs: 30.0,
            apply_timeout: Duration::from_secs(240),
            ..FleetOptions::default()
        },
    )
    .await
    .expect("fleet with FRR starts");
    let nodes = f.node_names();
    let mut inputs = samples().unwrap();
    inputs.push(single_node_segment(130, &nodes[0]));
    inputs.push(single_node_segment(131, &nodes[1]));
    f.apply(&inputs).await.unwrap();
    let rev1 = f
        .wait_latest(0, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    f.wait_all_on(rev1.metadata.name.as_deref().unwrap(), T)
        .await
        .unwrap();

    // The speaker: it calls the segment's gateway every second until the node listens.
    let speaker_ns = f
        .net
        .add_workload_on(&nodes[0], 4, "l2.130", "10.250.30.20/24", "10.250.30.1")
        .unwrap();
    ip(&["-n", &speaker_ns, "link", "set", "lo", "up"]).unwrap();
    ip(&[
        "-n",
        &speaker_ns,
        "addr",
        "add",
        "10.250.53.1/32",
        "dev",
        "lo",
    ])
    .unwrap();
    let speaker = netwave_control_plane::frr::FrrInstance::start_in(&speaker_ns).unwrap();
    speaker
        .vtysh(&[
            "-c",
            "configure terminal",
            "-c",
            "router bgp 65511",
            "-c",
            "bgp router-id 10.250.30.20",
            "-c",
            "no bgp default ipv4-unicast",
            "-c",
            &format!(
                "neighbor 10.250.30.1 remote-as {}",
                netwave_e2e::fleet::FRR_ASN
            ),
            "-c",
            "neighbor 10.250.30.1 timers connect 1",
            "-c",
            "address-family ipv4 unicast",
            "-c",
            "network 10.250.53.1/32",
            "-c",
            "neighbor 10.250.30.1 activate",
        ])
        .unwrap();
    let b = f
        .net
        .add_workload_on(&nodes[1], 2, "l2.131", "10.250.31.10/24", "10.250.31.1")
        .unwrap();

    let peering = |asn: u32| {
        json!({
            "apiVersion": "netwave.dev/v1alpha1",
            "kind": "BGPPeering",
            "metadata": {"name": "bgpaas"},
            "spec": {
                "peeringVlan": {"name": format!("vlan130-{}", nodes[0])},
                "remoteASN": asn,
                "enableBFD": false,
                "holdTime": "9s",
                "keepaliveTime": "3s",
                "maximumPrefixes": 10,
                "import": [{"cidr": "10.250.53.0/24", "le": 32, "action": "permit"}],
                "export": [{"cidr": "10.250.0.0/16", "le": 32, "action": "permit"}],
                "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": nodes[0].clone()}},
            }
        })
    };
    let t = Instant::now();
    f.apply(&[manifest(peering(65511))]).await.unwrap();
    let rev2 = f
        .wait_latest(rev1.spec.sequence, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    let rev2_name = rev2.metadata.name.clone().unwrap();
    f.wait_all_on(&rev2_name, T).await.unwrap();
    let rolled_out = t.elapsed();
    let configs = f.configs().await.unwrap();
    let probes = &configs[&nodes[0]].status.as_ref().unwrap().probes;
    let established = probes
        .iter()
        .find(|p| p.name == "bgp-peering bgpaas nw-peer-bgpaas-v4 vrf cluster")
        .unwrap_or_else(|| panic!("node-0 reports the peering's session: {probes:?}"));
    assert_eq!(established.result, "Passed", "{established:?}");
    let to_established = established.duration_seconds.unwrap_or_default();

    let fr1 = f.frr(&nodes[1]).unwrap();
    let t = Instant::now();
    f.eventually(
        T,
        "the speaker's prefix in VRF cluster on node-1",
        || async {
            let routes = fr1
                .vtysh(&["-c", "show ip route vrf cluster 10.250.53.1/32"])
                .map_err(|e| e.to_string())?;
            if routes.contains("10.250.53.1/32") && routes.contains("bgp") {
                Ok(())
            } else {
                Err(routes)
            }
        },
    )
    .await
    .unwrap();
    let evpn = t.elapsed();
    let ping = ping_eventually(
        &f,
        &b,
        "10.250.53.1",
        "node-1's vlan131 → the speaker's prefix",
    )
    .await;

    // The wrong AS: FRR refuses the speaker, the session is gone, node-0 fails within the hold time.
    let peerings: kube::Api<netwave_api::BGPPeering> = kube::Api::all(f.client.clone());
    let t = Instant::now();
    peerings
        .patch(
            "bgpaas",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"remoteASN": 65599}})),
        )
        .await
        .unwrap();
    let failed = f
        .wait_latest(rev2.spec.sequence, &[RevisionPhase::Failed], T)
        .await
        .unwrap();
    let st = failed.status.clone().unwrap();
    assert_eq!(st.failed_nodes[0].node, nodes[0], "{:?}", st.failed_nodes);
    assert!(
        st.failed_nodes[0]
            .message
            .contains("bgp-peering bgpaas nw-peer-bgpaas-v4 vrf cluster: not Established within its hold time (9 s)"),
        "the failure names the peering: {:?}",
        st.failed_nodes[0]
    );
    f.wait_all_on(&rev2_name, T).await.unwrap();
    let rolled_back = t.elapsed();
    let running = f.frr(&nodes[0]).unwrap().running().unwrap();
    assert!(
        running.contains("neighbor nw-peer-bgpaas-v4 remote-as 65511"),
        "node-0's FRR is back on the good peering:\n{running}"
    );
    ping_eventually(
        &f,
        &b,
        "10.250.53.1",
        "the speaker's prefix after the rollback",
    )
    .await;
    println!(
        "BGPPeering (full kernel, 2 nodes): rolled out in {:.1}s; session Established {:.2}s after \
         node-0 applied it; prefix in VRF cluster on node-1 {:.1}s later, first ping {:.1}s; wrong \
         AS failed and rolled back in {:.1}s; test {:.1}s",
        rolled_out.as_secs_f64(),
        to_established,
        evpn.as_secs_f64(),
        ping.as_secs_f64(),
        rolled_back.as_secs_f64(),
        test_start.elapsed().as_secs_f64(),
    );
    drop(speaker);
    let run = f.net.run_id.clone();
    drop(f);
    assert_eq!(namespaces_of(&run), Vec::<String>::new(), "namespaces left");
}

/// `rx_packets` of `dev` in namespace `ns`.
fn rx_packets(ns: &str, dev: &str) -> u64 {
    let out = ip(&["-n", ns, "-s", "-j", "link", "show", dev]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["stats64"]["rx"]["packets"].as_u64().unwrap_or(0)
}

/// Traffic mirroring (#29) in the VRF path: a MirrorSelector on node-0's segment vlan130 (VRF cluster)
/// copies the ICMP its workload sends (direction egress, from the workload) through an l2gre
/// MirrorTarget in VRF cluster, sourced from node-0's address of the VRF's loopback lo.mir, to a
/// collector on node-1's segment vlan131, across the fabric (the L3 VNI); the collector decapsulates
/// them with its own gretap (key 1001) and counts them. Removing the selector stops the copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_a_mirror_selector_copies_a_segments_pings_to_a_collector_over_gre_and_its_removal_stops_them()
 {
    if skip() {
        return;
    }
    let _g = Fleet::lock().await;
    let test_start = Instant::now();
    let mut f = Fleet::start(
        Bins::build().expect("netwave binaries"),
        FleetOptions {
            nodes: 2,
            max_unavailable: 1,
            frr: true,
            pools: Some(true),
            server: ApiServer::Testbed,
            health_deadline_secs: 30.0,
            apply_timeout: Duration::from_secs(240),
            ..FleetOptions::default()
        },
    )
    .await
    .expect("fleet with FRR starts");
    let nodes = f.node_names();
    let mut inputs = samples().unwrap();
    for m in &mut inputs {
        if let Manifest::Input(AnyInput::Vrf(v)) = m
            && v.metadata.name.as_deref() == Some("cluster")
        {
            v.spec.loopbacks.push(netwave_api::VrfLoopback {
                name: "lo.mir".into(),
                subnet: "10.250.91.0/29".into(),
            });
        }
    }
    inputs.push(single_node_segment(130, &nodes[0]));
    inputs.push(single_node_segment(131, &nodes[1]));
    f.apply(&inputs).await.unwrap();
    let rev1 = f
        .wait_latest(0, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    f.wait_all_on(rev1.metadata.name.as_deref().unwrap(), T)
        .await
        .unwrap();

    // The workload whose traffic is mirrored, and the collector on the other node.
    let a = f
        .net
        .add_workload_on(&nodes[0], 2, "l2.130", "10.250.30.20/24", "10.250.30.1")
        .unwrap();
    let col = f
        .net
        .add_workload_on(&nodes[1], 3, "l2.131", "10.250.31.100/24", "10.250.31.1")
        .unwrap();
    ip(&[
        "-n",
        &col,
        "link",
        "add",
        "gcol",
        "type",
        "gretap",
        "local",
        "10.250.31.100",
        "key",
        "1001",
    ])
    .unwrap();
    ip(&["-n", &col, "link", "set", "gcol", "up"]).unwrap();
    // The collector is known to its node (and so to the fabric) before the copies come.
    ping_eventually(&f, &col, "10.250.31.1", "the collector → its gateway").await;
    ping_eventually(&f, &a, "10.250.31.100", "the workload → the collector").await;

    let target = json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "MirrorTarget",
        "metadata": {"name": "collector"},
        "spec": {
            "type": "l2gre",
            "destinationIP": "10.250.31.100",
            "key": 1001,
            "destinationVrf": "cluster",
            "sourceLoopback": "lo.mir",
        }
    });
    let selector = json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "MirrorSelector",
        "metadata": {"name": "vlan130-icmp"},
        "spec": {
            "trafficMatch": {"protocol": "icmp"},
            "mirrorTarget": {"apiGroup": "netwave.dev", "kind": "MirrorTarget", "name": "collector"},
            "mirrorSource": {
                "apiGroup": "netwave.dev",
                "kind": "Layer2NetworkConfiguration",
                "name": format!("vlan130-{}", nodes[0]),
            },
            "direction": "egress",
        }
    });
    let t = Instant::now();
    f.apply(&[manifest(target), manifest(selector)])
        .await
        .unwrap();
    let rev2 = f
        .wait_latest(rev1.spec.sequence, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    let rev2_name = rev2.metadata.name.clone().unwrap();
    f.wait_all_on(&rev2_name, T).await.unwrap();
    let rolled_out = t.elapsed();
    let configs = f.configs().await.unwrap();
    let probes = &configs[&nodes[0]].status.as_ref().unwrap().probes;
    for name in ["mirror-tunnel collector (gtap-", "mirror vlan130-icmp"] {
        let p = probes
            .iter()
            .find(|p| p.name.starts_with(name))
            .unwrap_or_else(|| panic!("node-0 reports {name}: {probes:?}"));
        assert_eq!((p.result.as_str(), p.gating), ("Passed", true), "{p:?}");
    }
    assert!(
        configs[&nodes[1]].spec.config.mirrors.is_empty(),
        "node-1 has no vlan130: no mirror there"
    );
    let targets: kube::Api<netwave_api::MirrorTarget> = kube::Api::all(f.client.clone());
    f.eventually(T, "the MirrorTarget's status", || async {
        let st = targets
            .get("collector")
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        match (
            st.active_selectors,
            st.active_nodes,
            st.accepted().map(|c| c.status.clone()),
        ) {
            (Some(1), Some(1), Some(s)) if s == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();

    let five_pings = |to: &str| {
        let out = std::process::Command::new("ip")
            .args([
                "netns", "exec", &a, "ping", "-c", "5", "-i", "0.2", "-W", "1", "-q", to,
            ])
            .output()
            .expect("ping runs");
        assert!(out.status.success(), "5 pings {to}: {out:?}");
    };
    let before = rx_packets(&col, "gcol");
    five_pings("10.250.30.1");
    let first = Instant::now();
    f.eventually(T, "5 copies at the collector", || async {
        let n = rx_packets(&col, "gcol") - before;
        if n >= 5 {
            Ok(())
        } else {
            Err(format!("{n} copies"))
        }
    })
    .await
    .unwrap();
    let pinged = rx_packets(&col, "gcol") - before;
    let copies_in = first.elapsed();

    // The selector removed: a new revision without it; the copies stop.
    let selectors: kube::Api<netwave_api::MirrorSelector> = kube::Api::all(f.client.clone());
    let t = Instant::now();
    selectors
        .delete("vlan130-icmp", &Default::default())
        .await
        .unwrap();
    let rev3 = f
        .wait_latest(rev2.spec.sequence, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    f.wait_all_on(rev3.metadata.name.as_deref().unwrap(), T)
        .await
        .unwrap();
    let removed = t.elapsed();
    let configs = f.configs().await.unwrap();
    assert!(configs[&nodes[0]].spec.config.mirror_tunnels.is_empty());
    let quiet = rx_packets(&col, "gcol");
    five_pings("10.250.30.1");
    five_pings("10.250.31.100");
    let after = rx_packets(&col, "gcol") - quiet;
    assert_eq!(after, 0, "copies after the selector was removed");
    println!(
        "MirrorSelector (full kernel, 2 nodes): rolled out in {:.1}s; 5 pings from node-0's vlan130: \
         {pinged} copies at the collector on node-1 (gretap key 1001, across the L3 VNI), the first \
         within {:.1}s; selector removed and rolled out in {:.1}s, then 10 pings and {after} copies; test {:.1}s",
        rolled_out.as_secs_f64(),
        copies_in.as_secs_f64(),
        removed.as_secs_f64(),
        test_start.elapsed().as_secs_f64(),
    );
    let run = f.net.run_id.clone();
    drop(f);
    assert_eq!(namespaces_of(&run), Vec::<String>::new(), "namespaces left");
}
