//! Every input object tells the truth about itself (#18): the configurator writes `Accepted`, the nodes
//! it selects and a VRF's table into its status, so `kubectl get vrf,l2,rt` answers "is my object in
//! the rollout, where, with which table" — and writes a status only when it changes.

mod common;

use netwave_api::vocab::RevisionPhase;
use netwave_api::vocab::{ConditionStatus, accepted_reasons};
use std::time::Duration;

use common::*;
use kube::api::{Api, PostParams};
use netwave_api::{Layer2NetworkConfiguration, RoutingTable, VRFRouteConfiguration};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

fn kubectl(env: &Env, args: &[&str]) -> String {
    let o = env.cp().kubectl().args(args).output().unwrap();
    assert!(
        o.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Rows of `kubectl get` by NAME, each row as column name → value.
fn rows(table: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // Columns are left-aligned at the header's offsets; an empty cell is blank there.
    let head_line = table.lines().next().unwrap_or_default();
    let starts: Vec<usize> = header
        .iter()
        .scan(0, |from, h| {
            let at = head_line[*from..].find(h).unwrap() + *from;
            *from = at + h.len();
            Some(at)
        })
        .collect();
    lines
        .map(|l| {
            header
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let end = starts.get(i + 1).copied().unwrap_or(l.len()).min(l.len());
                    let cell = l.get(starts[i].min(l.len())..end).unwrap_or("").trim();
                    (h.to_string(), cell.to_string())
                })
                .collect()
        })
        .collect()
}

/// The admin's view: after a rollout every sample object reads ACCEPTED True with its node count, every
/// VRF shows its table (allocated ones too); a segment referencing a VRF that does not exist reads
/// `Accepted=False` naming that VRF, and the others say the revision fails elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_vrf_l2_rt_shows_accepted_nodes_and_tables() {
    let env = env().await;
    add_nodes(&env.client, &node_names(4)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(100));
    apply_samples(&env.client).await;
    let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "4"]));
    eventually(T, "the samples rolled out", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    let all_accepted = || async {
        let out = kubectl(&env, &["get", "vrf,l2,rt"]);
        let blank = out
            .lines()
            .filter(|l| !l.starts_with("NAME") && !l.trim().is_empty())
            .any(|l| !l.contains(ConditionStatus::True.as_str()));
        if blank { Err(out) } else { Ok(out) }
    };
    eventually(T, "every object accepted", all_accepted).await;
    let vrfs = kubectl(&env, &["get", "vrf"]);
    let got = rows(&vrfs);
    assert!(got.len() >= 3, "{vrfs}");
    for r in &got {
        assert_eq!(r["ACCEPTED"], ConditionStatus::True.as_str(), "{vrfs}");
        assert!(r["TABLE"].parse::<u32>().is_ok(), "TABLE filled: {vrfs}");
        assert!(r["NODES"].parse::<u32>().is_ok(), "NODES filled: {vrfs}");
    }
    assert!(
        got.iter()
            .any(|r| r["TABLE"].parse::<u32>().unwrap() >= 10_000_000),
        "an allocated table is shown: {vrfs}"
    );
    // A segment without a nodeSelector is on all four nodes.
    let l2 = rows(&kubectl(&env, &["get", "l2", "vlan103-monitoring"]));
    assert_eq!(l2[0]["NODES"], "4");

    // A cross-object error: a segment in a VRF nobody declared.
    let orphan: Layer2NetworkConfiguration = serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "Layer2NetworkConfiguration",
        "metadata": {"name": "vlan300-orphan"},
        "spec": {"id": 300, "vni": 30300, "mtu": 1500, "vrf": "no-such-vrf"},
    }))
    .unwrap();
    Api::<Layer2NetworkConfiguration>::all(env.client.clone())
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    let (message, generation) = eventually(T, "the orphan not accepted", || async {
        let o = Api::<Layer2NetworkConfiguration>::all(env.client.clone())
            .get("vlan300-orphan")
            .await
            .unwrap();
        let st = o.status.clone().unwrap_or_default();
        match st.accepted() {
            Some(c)
                if c.status == ConditionStatus::False.as_str()
                    && c.reason == accepted_reasons::INVALID =>
            {
                Ok((c.message.clone(), st.observed_generation))
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(message.contains("no-such-vrf"), "{message}");
    assert!(message.contains("spec.vrf"), "names the field: {message}");
    assert_eq!(generation, Some(1));
    let line = kubectl(&env, &["get", "l2", "vlan300-orphan"]);
    assert_eq!(
        rows(&line)[0]["ACCEPTED"],
        ConditionStatus::False.as_str(),
        "{line}"
    );
    // A good VRF says the revision fails because of something else, and names it.
    let vrf = Api::<VRFRouteConfiguration>::all(env.client.clone())
        .get("cluster")
        .await
        .unwrap();
    let st = vrf.status.unwrap();
    let a = st.accepted().unwrap();
    assert_eq!(
        (a.status.as_str(), a.reason.as_str()),
        (
            ConditionStatus::False.as_str(),
            accepted_reasons::REVISION_INVALID
        )
    );
    assert!(a.message.contains("vlan300-orphan"), "{}", a.message);
    assert_ne!(
        st.revision.as_deref(),
        Some(
            revisions(&env.client).await[0]
                .metadata
                .name
                .as_deref()
                .unwrap()
        ),
        "judges the newest revision, not the first"
    );
    // The status is the configurator's, written through the status subresource.
    let rt = Api::<RoutingTable>::all(env.client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    for o in rt.items {
        let managers: Vec<_> = o
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| m.subresource.as_deref() == Some("status"))
            .filter_map(|m| m.manager.clone())
            .collect();
        assert_eq!(managers, ["netwave-configurator"]);
    }
    c.stop().await;
}

/// Status writes happen only when a status changes: a rollout costs two writes per object (accepted
/// and rolling out, then ready: the kstatus conditions of #50, which do not change with every node), a
/// steady fleet none, a node joining one write per object that selects it. Counted at the testbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_status_writes_only_on_change() {
    let env = testbed_env().await;
    add_nodes(&env.client, &node_names(20)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(20));
    apply_samples(&env.client).await;
    let objects = {
        let v = Api::<VRFRouteConfiguration>::all(env.client.clone());
        let l = Api::<Layer2NetworkConfiguration>::all(env.client.clone());
        let r = Api::<RoutingTable>::all(env.client.clone());
        let lp = Default::default();
        v.list(&lp).await.unwrap().items.len()
            + l.list(&lp).await.unwrap().items.len()
            + r.list(&lp).await.unwrap().items.len()
    };
    env.tb().reset_counters();
    let (a, port) = args_with_metrics(&["--max-unavailable", "10"]);
    let c = Configurator::start(env.client.clone(), a);
    eventually(T, "the rollout to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    let status_writes = |c: &netwave_testbed::RequestCounts| {
        netwave_api::InputKind::ALL
            .iter()
            .map(|k| c.get("patch", &format!("{}/status", k.api_resource().plural)))
            .sum::<u64>()
    };
    // The agents' last reports and a few resyncs (2 s) handled.
    reconciles_pass(port, 2.0).await;
    let during = status_writes(&env.tb().counters());
    eprintln!("input status writes: {during} for {objects} objects over a 20-node rollout");
    assert_eq!(during as usize, 2 * objects, "two writes per object");
    env.tb().reset_counters();
    reconciles_pass(port, 2.0).await;
    assert_eq!(status_writes(&env.tb().counters()), 0, "steady: no writes");

    // A node joins: only the objects whose selector matches it change (their node count).
    create_node(
        &env.client,
        &node(
            "node-late",
            &[("node-restriction.kubernetes.io/netwave-pool", "compute")],
        ),
    )
    .await;
    eventually(T, "the joining node's status writes", || async {
        let n = status_writes(&env.tb().counters());
        (n >= 1).then_some(()).ok_or(format!("{n}"))
    })
    .await;
    reconciles_pass(port, 2.0).await;
    let join = status_writes(&env.tb().counters());
    eprintln!("input status writes for one joining node: {join} of {objects} objects");
    assert!(join >= 1 && (join as usize) < objects, "{join}");
    c.stop().await;
}

/// A BGPPeering is an input like the others (#29): folded into the revision and onto the nodes its
/// selector picks (their NodeNetworkConfig carries the resolved session: the segment's VRF and gateway
/// subnets), with `Accepted` and NODES in its status; one naming a segment that does not exist reads
/// `Accepted=False` naming the field, and no node gets the revision that has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bgp_peering_reads_accepted_with_its_nodes_and_a_bad_one_names_its_field() {
    use netwave_api::BGPPeering;
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(100));
    apply_samples(&env.client).await;
    let peering = |name: &str, segment: &str| -> BGPPeering {
        serde_json::from_value(json!({
            "apiVersion": "netwave.dev/v1alpha1",
            "kind": "BGPPeering",
            "metadata": {"name": name},
            "spec": {
                "peeringVlan": {"name": segment},
                "remoteASN": 65511,
                "enableBFD": true,
                "holdTime": "9s",
                "keepaliveTime": "3s",
                "import": [{"cidr": "10.250.3.0/24", "le": 32, "action": "permit"}],
                "export": [],
            },
        }))
        .unwrap()
    };
    let api = Api::<BGPPeering>::all(env.client.clone());
    api.create(
        &PostParams::default(),
        &peering("bgpaas", "vlan100-frontend"),
    )
    .await
    .unwrap();
    let _c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "3"]));
    eventually(T, "the samples and the peering rolled out", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == "Complete" => Ok(()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    for (node, c) in configs(&env.client).await {
        let peers = &c.spec.config.bgp_peers;
        assert_eq!(peers.len(), 1, "{node}: {peers:?}");
        assert_eq!(peers[0].vrf.as_deref(), Some("cluster"), "{node}");
        assert_eq!(
            peers[0].listen_ranges,
            ["10.250.0.0/24", "fd00:250::/64"],
            "{node}"
        );
        assert_eq!(
            (peers[0].keepalive_time, peers[0].hold_time),
            (Some(3), Some(9))
        );
        assert!(peers[0].bfd, "{node}");
    }
    let row = eventually(T, "the peering accepted on 3 nodes", || async {
        let r = rows(&kubectl(&env, &["get", "bgpp", "bgpaas"])).remove(0);
        if r["ACCEPTED"] == "True" && r["NODES"] == "3" {
            Ok(r)
        } else {
            Err(format!("{r:?}"))
        }
    })
    .await;
    assert_eq!(row["VLAN"], "vlan100-frontend");

    api.create(&PostParams::default(), &peering("orphan", "vlan999"))
        .await
        .unwrap();
    let message = eventually(T, "the orphan peering not accepted", || async {
        let st = api.get("orphan").await.unwrap().status.unwrap_or_default();
        match st.accepted() {
            Some(c) if c.status == "False" && c.reason == "Invalid" => Ok(c.message.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        message.contains("spec.peeringVlan.name: segment vlan999 does not exist"),
        "{message}"
    );
    let failed = eventually(T, "the revision with the orphan failed", || async {
        let rs = revisions(&env.client).await;
        match rs.last() {
            Some(r) if rs.len() == 2 && phase(r) == "Failed" => Ok(r.clone()),
            _ => Err(format!("{:?}", rs.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    let errors = failed.status.unwrap().validation.errors;
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("BGPPeering/orphan spec.peeringVlan.name")),
        "{errors:?}"
    );
    for (node, c) in configs(&env.client).await {
        assert_ne!(
            Some(c.spec.revision.as_str()),
            failed.metadata.name.as_deref(),
            "{node} got the failed revision"
        );
    }
}

/// MirrorTarget and MirrorSelector are inputs like the others (#29): folded into the revision and onto
/// the nodes that have the selector's source and the target's VRF (each node's tunnel from its own
/// address of the VRF's loopback), with `Accepted` and their nodes in status (a target also its
/// selectors, das-schiff's activeSelectors/activeNodes); a selector naming a target that does not
/// exist reads `Accepted=False` naming the field, and no node gets the revision that has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_read_accepted_with_their_nodes_and_a_bad_selector_names_its_field() {
    use kube::api::{Patch, PatchParams};
    use netwave_api::{MirrorSelector, MirrorTarget};
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(100));
    apply_samples(&env.client).await;
    Api::<VRFRouteConfiguration>::all(env.client.clone())
        .patch(
            "cluster",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"loopbacks": [{"name": "lo.mir", "subnet": "10.250.91.0/29"}]}}),
            ),
        )
        .await
        .unwrap();
    let target: MirrorTarget = serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "MirrorTarget",
        "metadata": {"name": "collector"},
        "spec": {"type": "l3gre", "destinationIP": "10.250.0.100", "key": 1001,
                 "destinationVrf": "cluster", "sourceLoopback": "lo.mir"},
    }))
    .unwrap();
    Api::<MirrorTarget>::all(env.client.clone())
        .create(&PostParams::default(), &target)
        .await
        .unwrap();
    let selector = |name: &str, target: &str| -> MirrorSelector {
        serde_json::from_value(json!({
            "apiVersion": "netwave.dev/v1alpha1",
            "kind": "MirrorSelector",
            "metadata": {"name": name},
            "spec": {
                "trafficMatch": {"protocol": "icmp"},
                "mirrorTarget": {"apiGroup": "network.t-caas.telekom.com", "kind": "MirrorTarget", "name": target},
                "mirrorSource": {"kind": "Layer2NetworkConfiguration", "name": "vlan100-frontend"},
                "direction": "ingress",
            },
        }))
        .unwrap()
    };
    let api = Api::<MirrorSelector>::all(env.client.clone());
    api.create(&PostParams::default(), &selector("frontend", "collector"))
        .await
        .unwrap();
    let _c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "3"]));
    eventually(T, "the samples and the mirror rolled out", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    let mut locals = std::collections::BTreeSet::new();
    for (node, c) in configs(&env.client).await {
        let (tunnels, mirrors) = (&c.spec.config.mirror_tunnels, &c.spec.config.mirrors);
        assert_eq!((tunnels.len(), mirrors.len()), (1, 1), "{node}");
        assert_eq!(
            (
                tunnels[0].vrf.as_str(),
                tunnels[0].remote.as_str(),
                tunnels[0].key
            ),
            ("cluster", "10.250.0.100", Some(1001)),
            "{node}"
        );
        assert!(
            tunnels[0].local.starts_with("10.250.91."),
            "{node}: {tunnels:?}"
        );
        locals.insert(tunnels[0].local.clone());
        assert_eq!(
            (mirrors[0].name.as_str(), mirrors[0].vlan),
            ("frontend", Some(100))
        );
    }
    assert_eq!(
        locals.len(),
        3,
        "each node its own source address: {locals:?}"
    );
    let row = eventually(
        T,
        "the target accepted with 1 selector on 3 nodes",
        || async {
            let r = rows(&kubectl(&env, &["get", "mirrortarget", "collector"])).remove(0);
            if r["ACCEPTED"] == "True" && r["SELECTORS"] == "1" && r["NODES"] == "3" {
                Ok(r)
            } else {
                Err(format!("{r:?}"))
            }
        },
    )
    .await;
    assert_eq!(row["TYPE"], "l3gre");
    eventually(T, "the selector accepted on 3 nodes", || async {
        let r = rows(&kubectl(&env, &["get", "mirrorselector", "frontend"])).remove(0);
        if r["ACCEPTED"] == "True" && r["NODES"] == "3" {
            Ok(())
        } else {
            Err(format!("{r:?}"))
        }
    })
    .await;

    api.create(&PostParams::default(), &selector("orphan", "nope"))
        .await
        .unwrap();
    let message = eventually(T, "the orphan selector not accepted", || async {
        let st = api.get("orphan").await.unwrap().status.unwrap_or_default();
        match st.accepted() {
            Some(c) if c.status == "False" && c.reason == "Invalid" => Ok(c.message.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        message.contains("spec.mirrorTarget.name: MirrorTarget nope does not exist"),
        "{message}"
    );
    let failed = eventually(T, "the revision with the orphan failed", || async {
        let rs = revisions(&env.client).await;
        match rs.last() {
            Some(r) if rs.len() == 2 && phase(r) == RevisionPhase::Failed.as_str() => Ok(r.clone()),
            _ => Err(format!("{:?}", rs.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    let errors = failed.status.unwrap().validation.errors;
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("MirrorSelector/orphan spec.mirrorTarget.name")),
        "{errors:?}"
    );
    for (node, c) in configs(&env.client).await {
        assert_ne!(
            Some(c.spec.revision.as_str()),
            failed.metadata.name.as_deref(),
            "{node} got the failed revision"
        );
    }
}
