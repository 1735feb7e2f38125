//! netwave installed as users install it (DESIGN §7, tier 5): `kubectl apply -k deploy/base` on a real
//! cluster (kube-apiserver with NodeRestriction and the Node authorizer, kube-controller-manager,
//! kube-scheduler, a kubelet on containerd, kube-proxy: `netwave_control_plane::node`), its own images
//! from `make images` imported into containerd, every component under its own identity.
//!
//! ```text
//!  admin: kubectl apply -k <overlay of deploy/base> ──► configurator Deployment (2 pods, pod network,
//!         kubectl apply -f deploy/samples/               in-cluster token, Lease) ──► NodeNetworkConfig
//!                                                     agent DaemonSet (hostNetwork in the node's
//!                                                     namespace, kubelet-mounted pod-bound token,
//!                                                     the admission policy on) ──► kernel + status
//! ```
//!
//! The test overlay changes only what a test must: images are never pulled (`imagePullPolicy: Never`),
//! the agent's state hostPath lives in the cluster's temporary directory instead of the host's
//! /var/lib/netwave, and pods stop in 2 s instead of 30.
//!
//! Needs root, the images (`make images`; `make test` builds them first) and the node's tools
//! (`tools/deps.sh cluster`); without them it fails saying which is missing.

use netwave_api::vocab::{NodePhase, RevisionPhase};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use netwave_agent::reconcile::Reason;
use netwave_agent::sim::Answer;
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig};
use netwave_control_plane::node::{Cluster, ClusterOptions, NETNS};
use netwave_e2e::fleet::workspace_root;
use netwave_e2e::install::SimNodes;
use netwave_e2e::install::{
    NS, TAINT, agent_metric, assert_nothing_refused, evpn_patches, images_of, kubectl, leader,
    node_links, pathdiff, ready_pods, until, write_overlay_on,
};
use netwave_e2e::netns::is_root;
use netwave_e2e::peer::{Peer, UNDERLAY, check_frr_conf};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_runs_on_a_real_node_under_its_own_identities() {
    if !is_root() {
        panic!("the real-node tier needs root (it runs a kubelet and containerd)");
    }
    let images = images_of(&["netwave-configurator", "netwave-agent-frr"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let t0 = Instant::now();
    // Every node of a fleet registers tainted until its network is configured: the install must
    // converge anyway (the configurator tolerates the taint; the agent removes it once healthy).
    let cluster = Cluster::start(ClusterOptions {
        taints: vec![format!("{TAINT}=:NoSchedule")],
        images,
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    // The agent's state hostPath: in the cluster's directory, removed with it.
    let state = cluster.scratch_dir("agent-state");
    // The node's BGP neighbour: FRR in a namespace of its own, wired to the node's eth1.
    let r = match Peer::start() {
        Ok(peer) => run(&cluster, &state, &peer).await,
        Err(e) => Err(e),
    };
    if let Err(e) = &r {
        eprintln!("{e:#}");
    }
    let netns_list = || {
        let out = std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect::<Vec<_>>()
    };
    let pods_netns: Vec<String> = netns_list()
        .into_iter()
        .filter(|n| n.starts_with("cni-"))
        .collect();
    cluster.stop().await;
    // The host is as it was: no namespace (the node's, its pods'), veth or pod cgroup left.
    let left = netns_list();
    assert!(
        !left.iter().any(|n| n == NETNS || pods_netns.contains(n)),
        "the node's and its pods' namespaces are gone after teardown: {left:?}"
    );
    assert!(
        std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .all(|h| !h.path().join("kubepods").exists()),
        "no kubepods cgroup is left after teardown"
    );
    r.unwrap();
    eprintln!("real node tier: {:.1} s in all", t0.elapsed().as_secs_f64());
}

/// The VLAN of the bad change (a segment for every node, which node-sim-2 fails).
const BAD_VLAN: u16 = 3999;

async fn run(cluster: &Cluster, state: &Path, peer: &Peer) -> Result<()> {
    let admin = cluster.admin().await?;
    let node = cluster.node().to_string();
    // The EVPN install (deploy/overlays/evpn): FRR's daemons beside the agent, the underlay from the
    // ConfigMap (here: the peer as the one neighbour), FRR's config directory in the cluster's directory.
    let frr_dir = cluster.scratch_dir("frr");
    let overlay = write_overlay_on(
        "deploy/overlays/evpn",
        state,
        &evpn_patches(&frr_dir, Some(UNDERLAY)),
    )?;
    let rel = pathdiff(&overlay, &workspace_root());

    // 1. Install as the README says, then the samples.
    let t = Instant::now();
    let applied = kubectl(cluster, &["apply", "-k", &rel])?;
    eprintln!("installed ({} objects)", applied.lines().count());
    // The EVPN install re-applies unchanged (its native sidecar spells out what the API server defaults):
    // a GitOps tool shows it in sync.
    let again = kubectl(cluster, &["apply", "-k", &rel])?;
    let changed: Vec<&str> = again
        .lines()
        .filter(|l| !l.ends_with(" unchanged"))
        .collect();
    assert!(
        changed.is_empty(),
        "changed on the second apply: {changed:#?}"
    );
    let configurators = until(
        cluster,
        "2 configurator pods Ready",
        Duration::from_secs(120),
        || {
            let admin = admin.clone();
            async move {
                let r = ready_pods(&admin, "netwave-configurator").await?;
                Ok((r.len() == 2).then_some(r))
            }
        },
    )
    .await?;
    let first_leader = until(
        cluster,
        "a configurator leader",
        Duration::from_secs(60),
        || {
            let admin = admin.clone();
            async move { leader(&admin).await }
        },
    )
    .await?;
    assert!(
        configurators.contains(&first_leader),
        "the Lease holder {first_leader} is one of the configurator pods {configurators:?}"
    );
    let agents = until(
        cluster,
        "the agent pod Ready",
        Duration::from_secs(120),
        || {
            let admin = admin.clone();
            async move {
                let r = ready_pods(&admin, "netwave-agent").await?;
                Ok((r.len() == 1).then_some(r))
            }
        },
    )
    .await?;
    eprintln!(
        "configurators {configurators:?} (leader {first_leader}) and agent {agents:?} Ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // Three more nodes beside the real one, each answered by a simulated agent under a token bound to
    // the agent DaemonSet's pod on it: rollouts cover four nodes (one at a time: the shipped
    // --max-unavailable=10%), in name order, the real node first. node-sim-2 fails any config with the
    // segment of the bad change (VLAN 3999) below.
    let fails_on_3999: netwave_agent::sim::Behaviour = Arc::new(|nnc: &NodeNetworkConfig| {
        let bad = nnc.name_any() == "node-sim-2"
            && nnc.spec.config.layer2s.iter().any(|l| l.vlan == BAD_VLAN);
        if bad {
            Answer::Invalid {
                reason: Reason::HealthCheckFailed,
                message: format!("simulated: VLAN {BAD_VLAN} broke this node's connectivity"),
            }
        } else {
            Answer::Provisioned
        }
    });
    let sims = SimNodes::start(
        cluster,
        &["node-sim-1", "node-sim-2", "node-sim-3"],
        fails_on_3999,
        Duration::from_millis(300),
    )
    .await?;
    let r: Result<()> = async {
    let t = Instant::now();
    kubectl(cluster, &["apply", "-f", "deploy/samples/"])?;
    let nnc: Api<NodeNetworkConfig> = Api::all(admin.clone());
    let revisions: Api<NetworkConfigRevision> = Api::all(admin.clone());
    // `kubectl apply -f` creates the objects one by one, so a revision may be cut before the last one
    // exists: wait for the node to be Provisioned on the newest revision with the default-VRF segment
    // every node gets (vlan103-monitoring: bridge l2.103) in its namespace's kernel.
    let provisioned = until(
        cluster,
        "the samples Provisioned on the real node, bridge l2.103 in its kernel",
        Duration::from_secs(180),
        || {
            let (nnc, revisions, node) = (nnc.clone(), revisions.clone(), node.clone());
            async move {
                let Some(n) = nnc.get_opt(&node).await? else {
                    return Ok(None);
                };
                let newest = revisions
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .max_by_key(|r| r.spec.sequence);
                let Some(newest) = newest else {
                    return Ok(None);
                };
                let st = n.status.clone().unwrap_or_default();
                let on_it = n.spec.revision == newest.name_any()
                    && st.observed_revision.as_deref() == Some(newest.name_any().as_str())
                    && st.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && node_links().lines().any(|l| l.starts_with("l2.103"));
                Ok(on_it.then_some(newest.name_any()))
            }
        },
    )
    .await?;
    eprintln!(
        "samples: revision {provisioned} Provisioned on {node} in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // The agent takes the bootstrap taint off once healthy: a write of its own after its report (a
    // conditional one, retried when the kubelet's heartbeat moved the Node in between), so it is
    // waited for, not read once.
    let nodes = Api::<Node>::all(admin.clone());
    until(
        cluster,
        &format!("the agent removed {TAINT} from its healthy node"),
        Duration::from_secs(30),
        || {
            let (nodes, node) = (nodes.clone(), node.clone());
            async move {
                let taints = nodes.get(&node).await?.spec.and_then(|s| s.taints);
                let tainted = taints.unwrap_or_default().iter().any(|t| t.key == TAINT);
                Ok((!tainted).then_some(()))
            }
        },
    )
    .await?;

    // The node's FRR runs what the NodeNetworkConfig renders to, and EVPN works both ways: the peer
    // learns the node's VNI 1000103 (type-3 route from its VTEP, the node's address), and the node's zebra
    // installs the peer's VTEP as VNI 1000103's flood entry in the node's kernel.
    let t = Instant::now();
    let config = nnc.get(&node).await?.spec.config;
    check_frr_conf(&frr_dir, &config)?;
    let evpn = peer
        .evpn_up(
            cluster,
            "EVPN between the node's FRR and its peer (session, type-3 routes, flood entries)",
            Duration::from_secs(60),
        )
        .await?;
    eprintln!(
        "FRR in the agent's pod runs the NodeNetworkConfig's config; EVPN up {:.1} s after Provisioned: {evpn}",
        t.elapsed().as_secs_f64()
    );

    // 2. Leader failover: the leader pod is deleted; the other takes the Lease.
    let t = Instant::now();
    Api::<Pod>::namespaced(admin.clone(), NS)
        .delete(&first_leader, &DeleteParams::default())
        .await?;
    let second = until(cluster, "a new leader", Duration::from_secs(90), || {
        let (admin, old) = (admin.clone(), first_leader.clone());
        async move { Ok(leader(&admin).await?.filter(|l| *l != old)) }
    })
    .await?;
    eprintln!(
        "leader {first_leader} deleted: {second} leads after {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // 3. The agent pod is deleted; the DaemonSet makes a new one, which finds its backup on the hostPath
    // and writes nothing to the kernel for the config it already runs.
    let t = Instant::now();
    Api::<Pod>::namespaced(admin.clone(), NS)
        .delete(&agents[0], &DeleteParams::default())
        .await?;
    let new_agent = until(
        cluster,
        "a new agent pod Ready",
        Duration::from_secs(120),
        || {
            let (admin, old) = (admin.clone(), agents[0].clone());
            async move {
                let r = ready_pods(&admin, "netwave-agent").await?;
                Ok(r.into_iter().find(|p| *p != old))
            }
        },
    )
    .await?;
    // Its first drift check has observed the kernel (the managed objects are counted then) against the
    // backup's config: only after that does "no write" mean something.
    let managed = until(
        cluster,
        "the new agent's first drift check",
        Duration::from_secs(60),
        || async {
            Ok(agent_metric("netwave_agent_managed_objects")
                .await
                .ok()
                .filter(|m| *m > 0.0))
        },
    )
    .await?;
    let writes = agent_metric("netwave_agent_netlink_writes_total").await?;
    let log = cluster.container_log(NS, &new_agent, "agent");
    assert!(
        log.contains("found the last good config on disk"),
        "the restarted agent says what it found on its hostPath:\n{log}"
    );
    eprintln!(
        "agent pod {} replaced by {new_agent} in {:.1} s; it found its backup, manages {managed} kernel objects, netlink writes: {writes}",
        agents[0],
        t.elapsed().as_secs_f64()
    );
    assert_eq!(
        writes, 0.0,
        "the restarted agent found its backup and wrote nothing to the kernel"
    );
    // The new pod's FRR booted from the config the agent last applied (hostPath): the session and the
    // flood entries come back, and the file is still what the NodeNetworkConfig renders to.
    let evpn = peer
        .evpn_up(
            cluster,
            "EVPN back after the agent pod's restart",
            Duration::from_secs(60),
        )
        .await?;
    check_frr_conf(&frr_dir, &config)?;
    eprintln!(
        "EVPN back {:.1} s after the agent pod was deleted: {evpn}",
        t.elapsed().as_secs_f64()
    );

    // 4. A bad change across the four nodes: the real node takes it first (its kernel gets the new
    // bridge), node-sim-1 next, node-sim-2 fails it; the rollout halts before node-sim-3 and every touched
    // node goes back to the last good revision (the real node's kernel loses the bridge again).
    let good = provisioned.clone();
    let bad_dev = format!("l2.{BAD_VLAN}");
    let t = Instant::now();
    let bad = format!(
        "apiVersion: netwave.dev/v1alpha1\nkind: Layer2NetworkConfiguration\nmetadata:\n  name: \
         vlan{BAD_VLAN}-bad\nspec:\n  id: {BAD_VLAN}\n  vni: 1003999\n  mtu: 1500\n"
    );
    let bad_file = cluster.scratch_dir("bad-l2.yaml");
    std::fs::write(&bad_file, bad)?;
    kubectl(cluster, &["apply", "-f", &bad_file.display().to_string()])?;
    let (bad_rev, real_took) = until(
        cluster,
        &format!("the real node Provisioned on the bad change, {bad_dev} in its kernel"),
        Duration::from_secs(120),
        || {
            let (nnc, node, good, bad_dev) = (nnc.clone(), node.clone(), good.clone(), bad_dev.clone());
            async move {
                let n = nnc.get(&node).await?;
                let st = n.status.clone().unwrap_or_default();
                let on_bad = n.spec.revision != good
                    && st.observed_revision.as_deref() == Some(n.spec.revision.as_str())
                    && st.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && node_links().lines().any(|l| l.starts_with(&format!("{bad_dev} ")) || l.starts_with(&format!("{bad_dev}@")));
                Ok(on_bad.then(|| (n.spec.revision.clone(), t.elapsed())))
            }
        },
    )
    .await?;
    let failed = until(
        cluster,
        &format!("{bad_rev} Failed and every touched node back on {good}"),
        Duration::from_secs(120),
        || {
            let (nnc, revisions, good, bad_rev, bad_dev) =
                (nnc.clone(), revisions.clone(), good.clone(), bad_rev.clone(), bad_dev.clone());
            async move {
                let rev = revisions.get(&bad_rev).await?;
                if rev.status.as_ref().and_then(|s| s.phase.as_deref()) != Some(RevisionPhase::Failed.as_str()) {
                    return Ok(None);
                }
                let mut back = Vec::new();
                for n in nnc.list(&ListParams::default()).await?.items {
                    let st = n.status.clone().unwrap_or_default();
                    let ok = n.spec.revision == good
                        && st.observed_revision.as_deref() == Some(good.as_str())
                        && st.phase.as_deref() == Some(NodePhase::Provisioned.as_str());
                    back.push((n.name_any(), ok));
                }
                let kernel_back = !node_links().contains(&bad_dev);
                Ok((back.iter().all(|(_, ok)| *ok) && kernel_back).then_some(back))
            }
        },
    )
    .await?;
    let rev = revisions.get(&bad_rev).await?;
    let st = rev.status.clone().unwrap_or_default();
    eprintln!(
        "bad change {bad_rev}: the real node ran it after {:.1} s; node-sim-2 failed it; {} Failed \
         (updated {}, failed {}) and all {} nodes back on {good} after {:.1} s",
        real_took.as_secs_f64(),
        bad_rev,
        st.updated,
        st.failed,
        failed.len(),
        t.elapsed().as_secs_f64()
    );
    assert_eq!(failed.len(), 4, "four nodes: {failed:?}");
    kubectl(cluster, &["delete", "-f", &bad_file.display().to_string()])?;

    // 4. Nothing any netwave component did was refused.
    let mut pods: Vec<String> = configurators.clone();
    pods.extend(agents.iter().cloned());
    pods.push(second);
    pods.push(new_agent);
    assert_nothing_refused(cluster, &pods);
    let ds = Api::<DaemonSet>::namespaced(admin.clone(), NS)
        .get("netwave-agent")
        .await?;
    let deploy = Api::<Deployment>::namespaced(admin.clone(), NS)
        .get("netwave-configurator")
        .await?;
    eprintln!(
        "agent DaemonSet {:?} ready, configurator Deployment {:?} ready",
        ds.status.map(|s| s.number_ready),
        deploy.status.and_then(|s| s.ready_replicas)
    );
    Ok(())
    }
    .await;
    sims.stop(cluster).await;
    let _ = std::fs::remove_dir_all(&overlay);
    r
}
