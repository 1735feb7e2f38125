//! netwave's own upgrade and downgrade on the real node (#46; DESIGN §7, tier 5): the previous release
//! installed as its users installed it — its manifests, CRDs and images, built from its commit
//! (`tests/previous-release/images.sh`, cached outside the repository) — the samples rolled out, this
//! tree installed over it with `kubectl apply -k` while a rollout is in flight, then the previous
//! release installed back over this tree's objects.
//!
//! ```text
//!  0.1.0 install ─► samples Complete ─► change A rolling ─► apply -k this tree ─► A Complete (0.2.0
//!  configurator), change B Complete ─► apply -k 0.1.0 (its CRDs over 0.2.0's objects) ─► change C
//!  Complete (0.1.0 configurator and agents)
//! ```
//!
//! Four nodes: the real one (kubelet on containerd, the agent with FRR, a BGP peer) and three whose
//! kubelet the harness plays ([`SimNodes::start_with_kubelet`]): it reports their agent pods Ready,
//! confirms their deletion and restarts their simulated agent under the new pod's token, so the agent
//! DaemonSet's rolling update goes over them as over real nodes. The simulated agents answer change A
//! 15 s after it reaches them, so its rollout over the four nodes (one at a time) lasts longer than the
//! configurator Deployment's own rolling update.
//!
//! What is asserted: no node ever failed; the real node's kernel is the same before and after each
//! version change, and the agent of the other version started on it writes nothing to it (its
//! rendering of the config the node runs is the same); the Lease passes between the versions; each
//! version's configurator completes a rollout on objects the other wrote, and every status write
//! succeeds under the other version's CRDs; nothing any component did was refused.
//!
//! Needs root, this tree's images (`make images`), the previous release (`make previous-release`; made
//! here on first use otherwise) and the node's tools (`tools/deps.sh cluster`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use netwave_api::vocab::{NodePhase, RevisionPhase};
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig};
use netwave_control_plane::node::{Cluster, ClusterOptions, NETNS, OciImage};
use netwave_e2e::fleet::workspace_root;
use netwave_e2e::install::{
    NS, SimNodes, agent_metric, assert_nothing_refused, evpn_patches, images_of, kubectl, leader,
    node_links, pathdiff, previous_release, until, write_overlay_on,
};
use netwave_e2e::netns::{ip, is_root};
use netwave_e2e::peer::{Peer, UNDERLAY, check_frr_conf};

const THIS: &str = env!("CARGO_PKG_VERSION");
const SIMS: [&str; 3] = ["node-sim-1", "node-sim-2", "node-sim-3"];
/// How long a simulated agent takes to answer change A (the one in flight during the upgrade: over
/// the three simulated nodes, one at a time, longer than the configurator Deployment's rolling update)
/// and any other.
const SLOW: Duration = Duration::from_secs(15);
const FAST: Duration = Duration::from_secs(1);
/// Change A's segment (B and C add 3102 and 3103 beside it).
const VLAN_A: u16 = 3101;
const T: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_during_a_rollout_and_a_downgrade_keep_every_node_on_a_complete_revision() {
    if !is_root() {
        panic!("the real-node tier needs root (it runs a kubelet and containerd)");
    }
    let t0 = Instant::now();
    let prev = previous_release("images.sh").unwrap_or_else(|e| panic!("{e:#}"));
    let prev_version = version_of(&prev).unwrap_or_else(|e| panic!("{e:#}"));
    let mut images = images_of(&["netwave-configurator", "netwave-agent-frr"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let drill = DrillImage::build(&images[1]).unwrap_or_else(|e| panic!("{e:#}"));
    images.push(drill.image.clone());
    for name in ["netwave-configurator", "netwave-agent-frr"] {
        images.push(OciImage {
            layout: prev.join("images").join(name),
            name: format!("ghcr.io/netwave/{name}"),
        });
    }
    let cluster = Cluster::start(ClusterOptions {
        images,
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let state = cluster.scratch_dir("agent-state");
    let r = match Peer::start() {
        Ok(peer) => run(&cluster, &state, &peer, &prev, &prev_version).await,
        Err(e) => Err(e),
    };
    if let Err(e) = &r {
        eprintln!("{e:#}");
    }
    cluster.stop().await;
    r.unwrap();
    eprintln!(
        "upgrade on the real node: {:.1} s in all",
        t0.elapsed().as_secs_f64()
    );
}

/// The tag of the drill image: this tree's agent with FRR, its agent built with `rendering-drill`.
fn drill_tag() -> String {
    format!("v{THIS}-drill")
}

/// This tree's agent image with FRR, its agent replaced by the workspace's debug build, which has the
/// `rendering-drill` feature (`--rendering-drill`, env `NETWAVE_RENDERING_DRILL`): an agent release
/// whose rendering differs, to show that its upgrade stops at the node whose probes it fails. The debug
/// build links glibc dynamically; the image's Debian root filesystem has the same glibc as the machine
/// that built it (checked: the agent answers `--version` in the image's chroot).
struct DrillImage {
    image: OciImage,
    dir: PathBuf,
}

impl DrillImage {
    fn build(agent_frr: &OciImage) -> Result<DrillImage> {
        let bins = netwave_e2e::fleet::Bins::build()?;
        let help = std::process::Command::new(&bins.agent)
            .arg("--help")
            .output()?;
        if !String::from_utf8_lossy(&help.stdout).contains("--rendering-drill") {
            bail!(
                "{} has no --rendering-drill: build it with `--features netwave-agent/rendering-drill`",
                bins.agent.display()
            );
        }
        let dir = workspace_root()
            .join("target")
            .join(format!("real-node-drill-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let storage = dir.join("buildah");
        let buildah = |args: &[&str]| -> Result<String> {
            let out = std::process::Command::new("buildah")
                .arg("--root")
                .arg(storage.join("root"))
                .arg("--runroot")
                .arg(storage.join("run"))
                .args(["--storage-driver", "vfs"])
                .args(args)
                .output()
                .context("buildah")?;
            if !out.status.success() {
                bail!("buildah {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        let from = format!("oci:{}:v{THIS}", agent_frr.layout.display());
        let c = buildah(&["from", "--quiet", &from])?;
        let agent = bins.agent.display().to_string();
        buildah(&[
            "copy",
            "--chmod",
            "0555",
            &c,
            &agent,
            "/usr/local/bin/netwave-agent",
        ])?;
        let version = buildah(&[
            "run",
            "--isolation",
            "chroot",
            &c,
            "--",
            "/usr/local/bin/netwave-agent",
            "--version",
        ])?;
        if version != format!("netwave-agent {THIS}") {
            bail!("the drill agent in its image says {version:?}");
        }
        let tag = drill_tag();
        let local = format!("localhost/netwave-agent-frr:{tag}");
        buildah(&["commit", "--quiet", &c, &local])?;
        let layout = dir.join("netwave-agent-frr");
        buildah(&[
            "push",
            "--quiet",
            &local,
            &format!("oci:{}:{tag}", layout.display()),
        ])?;
        let _ = buildah(&["rm", "--all"]);
        let _ = buildah(&["rmi", "--all", "--force"]);
        let _ = std::fs::remove_dir_all(&storage);
        Ok(DrillImage {
            image: OciImage {
                layout,
                name: agent_frr.name.clone(),
            },
            dir,
        })
    }
}

impl Drop for DrillImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The release's version, from its build-info ("netwave 0.1.0 (commit …").
fn version_of(prev: &Path) -> Result<String> {
    let info = std::fs::read_to_string(prev.join("build-info"))?;
    info.split_whitespace()
        .nth(1)
        .map(str::to_string)
        .with_context(|| format!("no version in {}/build-info: {info}", prev.display()))
}

/// The BGP peer (the node's neighbour on eth1) is pinged by the agent's health probes too: the drill
/// below blackholes it. The rest is what both releases ship in `netwave-agent-health`.
const PEER_ADDR: &str = "198.19.1.2";
const HEALTH_PATCH: &str = r#"  - patch: |
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: netwave-agent-health, namespace: netwave-system}
      data:
        health.yaml: |
          interfaces: ["eth0"]
          tcp: []
          icmp: ["198.19.1.2"]
          apiServer: true
          attemptTimeoutSeconds: 1
          deadlineSeconds: 30
          settleSeconds: 1
          taints: ["netwave.dev/network-unavailable"]
"#;

/// The two installs: kustomize overlays (the test's patches, the EVPN install, the peer as the
/// underlay's neighbour) over this tree's deploy/overlays/evpn and over the previous release's, copied
/// into the repository's target/ so that both are loaded the same way.
struct Installs {
    this: String,
    prev: String,
    dirs: Vec<PathBuf>,
}

impl Installs {
    fn write(cluster: &Cluster, state: &Path, prev: &Path) -> Result<Installs> {
        let frr_dir = cluster.scratch_dir("frr");
        let mut patches = evpn_patches(&frr_dir, Some(UNDERLAY));
        patches.push_str(HEALTH_PATCH);
        let copy = workspace_root()
            .join("target")
            .join(format!("previous-release-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&copy);
        std::fs::create_dir_all(&copy)?;
        for dir in ["deploy", "crds"] {
            let out = std::process::Command::new("cp")
                .arg("-r")
                .arg(prev.join(dir))
                .arg(copy.join(dir))
                .output()?;
            if !out.status.success() {
                bail!("cp {dir}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let this = write_overlay_on("deploy/overlays/evpn", state, &patches)?;
        let prev_base = pathdiff(&copy.join("deploy/overlays/evpn"), &workspace_root());
        let prev_overlay = write_overlay_on(&prev_base, state, &patches)?;
        Ok(Installs {
            this: pathdiff(&this, &workspace_root()),
            prev: pathdiff(&prev_overlay, &workspace_root()),
            dirs: vec![copy, this, prev_overlay],
        })
    }
}

impl Drop for Installs {
    fn drop(&mut self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// What netwave manages in the node's kernel: links, addresses, its routes (protocol 242) and rules.
/// The pods' veths are the container runtime's (they change when a pod is replaced) and left out.
fn kernel_state() -> Result<String> {
    let mut out = String::new();
    for args in [
        vec!["-br", "link"],
        vec!["-br", "addr"],
        vec!["route", "show", "table", "all", "proto", "242"],
        vec!["-6", "route", "show", "table", "all", "proto", "242"],
        vec!["rule"],
    ] {
        let mut full = vec!["-n", NETNS];
        full.extend(args);
        for line in ip(&full)?.lines().filter(|l| !l.starts_with("veth")) {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// The netwave pods of `app` and the version each runs (its image's tag without the `v`), Ready or not.
async fn pod_versions(admin: &Client, app: &str) -> Result<Vec<(String, String, bool)>> {
    let pods = Api::<Pod>::namespaced(admin.clone(), NS)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let image = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            let version = image.rsplit_once(":v").map(|(_, v)| v.to_string());
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            (p.name_any(), version.unwrap_or_default(), ready)
        })
        .collect())
}

/// Waits until `kubectl apply -k <overlay>` has rolled out: both configurator pods and the agent pod
/// of every node run `version` and are Ready, and a pod of `version` holds the Lease. Returns the
/// leader and the real node's agent pod.
async fn rolled_to(cluster: &Cluster, admin: &Client, version: &str) -> Result<(String, String)> {
    let node = cluster.node().to_string();
    until(
        cluster,
        &format!("every netwave pod on {version} and Ready, a {version} configurator leading"),
        T,
        || async {
            let configurators = pod_versions(admin, "netwave-configurator").await?;
            let agents = pod_versions(admin, "netwave-agent").await?;
            let all_on = |pods: &[(String, String, bool)], n: usize| {
                pods.len() == n && pods.iter().all(|(_, v, ready)| v == version && *ready)
            };
            if !all_on(&configurators, 2) || !all_on(&agents, 1 + SIMS.len()) {
                return Ok(None);
            }
            let Some(lead) = leader(admin).await? else {
                return Ok(None);
            };
            if !configurators.iter().any(|(p, _, _)| *p == lead) {
                return Ok(None);
            }
            let real = Api::<Pod>::namespaced(admin.clone(), NS)
                .list(
                    &ListParams::default()
                        .labels("app.kubernetes.io/name=netwave-agent")
                        .fields(&format!("spec.nodeName={node}")),
                )
                .await?
                .items
                .into_iter()
                .find(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| p.name_any());
            Ok(real.map(|r| (lead, r)))
        },
    )
    .await
}

/// The newest revision's name and sequence.
async fn newest(revisions: &Api<NetworkConfigRevision>) -> Result<Option<(String, u64)>> {
    Ok(revisions
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .max_by_key(|r| r.spec.sequence)
        .map(|r| (r.name_any(), r.spec.sequence)))
}

/// Waits for a revision newer than `after` to be Complete with every node Provisioned on it and none
/// failed; returns its name.
async fn complete_after(
    cluster: &Cluster,
    admin: &Client,
    after: u64,
    what: &str,
) -> Result<String> {
    let revisions: Api<NetworkConfigRevision> = Api::all(admin.clone());
    let nnc: Api<NodeNetworkConfig> = Api::all(admin.clone());
    until(cluster, what, T, || async {
        let Some((name, seq)) = newest(&revisions).await? else {
            return Ok(None);
        };
        if seq <= after {
            return Ok(None);
        }
        let rev = revisions.get(&name).await?;
        let st = rev.status.unwrap_or_default();
        if st.failed > 0 {
            bail!(
                "{name} has {} failed node(s): {:?}",
                st.failed,
                st.failed_nodes
            );
        }
        if st.phase.as_deref() != Some(RevisionPhase::Complete.as_str()) {
            return Ok(None);
        }
        let configs = nnc.list(&ListParams::default()).await?.items;
        let on_it = configs.len() == 1 + SIMS.len()
            && configs.iter().all(|n| {
                let st = n.status.clone().unwrap_or_default();
                n.spec.revision == name
                    && st.observed_revision.as_deref() == Some(name.as_str())
                    && st.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
            });
        Ok(on_it.then_some(name.clone()))
    })
    .await
}

/// A default-VRF segment for every node (vlan `id`, VNI 1000000 + `id`), as a file to apply.
fn segment(cluster: &Cluster, id: u16) -> Result<String> {
    let file = cluster.scratch_dir(&format!("vlan{id}.yaml"));
    std::fs::write(
        &file,
        format!(
            "apiVersion: netwave.dev/v1alpha1\nkind: Layer2NetworkConfiguration\nmetadata:\n  name: \
             vlan{id}-upgrade\nspec:\n  id: {id}\n  vni: {}\n  mtu: 1500\n",
            1_000_000 + u32::from(id)
        ),
    )?;
    Ok(file.display().to_string())
}

/// The agent of another version has started on the real node and made its first drift check (the
/// managed objects are counted then): returns its netlink writes so far.
async fn first_check_writes(cluster: &Cluster, pod: &str) -> Result<f64> {
    until(
        cluster,
        &format!("{pod}'s first drift check"),
        Duration::from_secs(90),
        || async {
            Ok(agent_metric("netwave_agent_managed_objects")
                .await
                .ok()
                .filter(|m| *m > 0.0))
        },
    )
    .await?;
    agent_metric("netwave_agent_netlink_writes_total").await
}

/// Rolls out the drill image with a rendering that blackholes the peer the health probes ping, and
/// waits until the real node's new agent has refused it: the `AgentUpgradeRefused` Event, the
/// `netwave_agent_upgrade_refused` gauge at 1 (what `NetwaveAgentUpgradeRefused` fires on), the pod
/// never Ready so the rolling update stops, and every node still Provisioned on `revision`. Returns
/// the refusing pod.
async fn bad_agent_release(cluster: &Cluster, admin: &Client, revision: &str) -> Result<String> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Event;
    let node = cluster.node().to_string();
    let t = Instant::now();
    let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [{
        "name": "agent",
        "image": format!("ghcr.io/netwave/netwave-agent-frr:{}", drill_tag()),
        "env": [{"name": "NETWAVE_RENDERING_DRILL", "value": format!("blackhole:{PEER_ADDR}/32")}],
    }]}}}});
    kubectl(
        cluster,
        &[
            "-n",
            NS,
            "patch",
            "daemonset",
            "netwave-agent",
            "-p",
            &patch.to_string(),
        ],
    )?;
    let events: Api<Event> = Api::all(admin.clone());
    let (pod, message) = until(
        cluster,
        "the drill agent on the real node refuses its rendering",
        T,
        || async {
            let pods = pod_versions(admin, "netwave-agent").await?;
            let drill = format!("{THIS}-drill");
            let Some((pod, _, ready)) = pods.iter().find(|(p, v, _)| {
                *v == drill && cluster.container_log(NS, p, "agent").contains("starting")
            }) else {
                return Ok(None);
            };
            if *ready {
                bail!("the drill agent {pod} is Ready: its rendering passed the gate");
            }
            let refused = events
                .list(&ListParams::default().fields("reason=AgentUpgradeRefused"))
                .await?
                .items
                .into_iter()
                .find(|e| e.involved_object.name.as_deref() == Some(node.as_str()));
            let gauge = agent_metric("netwave_agent_upgrade_refused").await.ok();
            Ok(match (refused, gauge) {
                (Some(e), Some(1.0)) => Some((pod.clone(), e.message.unwrap_or_default())),
                _ => None,
            })
        },
    )
    .await?;
    eprintln!(
        "drill agent {pod} refused after {:.1} s: {message}",
        t.elapsed().as_secs_f64()
    );
    // The rolling update stays stopped there: the pod is not Ready a while later, and no node's
    // config or verdict moved.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let still = pod_versions(admin, "netwave-agent").await?;
    assert!(
        still.iter().any(|(p, _, ready)| *p == pod && !ready),
        "the refusing agent {pod} stays not Ready: {still:?}"
    );
    let ds = Api::<DaemonSet>::namespaced(admin.clone(), NS)
        .get("netwave-agent")
        .await?;
    let st = ds.status.unwrap_or_default();
    assert!(
        st.number_unavailable.unwrap_or(0) >= 1,
        "the DaemonSet counts the refusing node unavailable, so its rolling update stops: {st:?}"
    );
    for n in Api::<NodeNetworkConfig>::all(admin.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        let s = n.status.clone().unwrap_or_default();
        assert!(
            n.spec.revision == revision
                && s.phase.as_deref() == Some(NodePhase::Provisioned.as_str()),
            "{} stays Provisioned on {revision}: {:?} {:?}",
            n.name_any(),
            n.spec.revision,
            s.phase
        );
    }
    Ok(pod)
}

async fn run(
    cluster: &Cluster,
    state: &Path,
    peer: &Peer,
    prev: &Path,
    prev_version: &str,
) -> Result<()> {
    let admin = cluster.admin().await?;
    let node = cluster.node().to_string();
    let installs = Installs::write(cluster, state, prev)?;
    let revisions: Api<NetworkConfigRevision> = Api::all(admin.clone());
    let nnc: Api<NodeNetworkConfig> = Api::all(admin.clone());
    let mut pods_seen: Vec<String> = Vec::new();

    // 1. The previous release, installed as its README said, and the samples on it.
    let t = Instant::now();
    kubectl(cluster, &["apply", "-k", &installs.prev])?;
    let (lead, agent) = until(
        cluster,
        &format!("the {prev_version} install Ready"),
        T,
        || async {
            let c = pod_versions(&admin, "netwave-configurator").await?;
            let a = pod_versions(&admin, "netwave-agent").await?;
            let ready = c.len() == 2
                && a.len() == 1
                && c.iter().chain(&a).all(|(_, v, r)| v == prev_version && *r);
            Ok(match (ready, leader(&admin).await?) {
                (true, Some(l)) => Some((l, a[0].0.clone())),
                _ => None,
            })
        },
    )
    .await?;
    eprintln!(
        "{prev_version} installed in {:.1} s: leader {lead}, agent {agent}",
        t.elapsed().as_secs_f64()
    );
    pods_seen.extend([lead, agent]);
    let always: netwave_agent::sim::Behaviour =
        Arc::new(|_: &NodeNetworkConfig| netwave_agent::sim::Answer::Provisioned);
    let pace: netwave_agent::sim::Pace = Arc::new(|nnc: &NodeNetworkConfig| {
        let vlans: Vec<u16> = nnc.spec.config.layer2s.iter().map(|l| l.vlan).collect();
        if vlans.contains(&VLAN_A) && !vlans.contains(&(VLAN_A + 1)) {
            SLOW
        } else {
            FAST
        }
    });
    let sims = SimNodes::start_with_kubelet(cluster, &SIMS, always, pace).await?;
    let r = async {
        let t = Instant::now();
        kubectl(cluster, &["apply", "-f", "deploy/samples/"])?;
        // `kubectl apply -f` creates the objects one by one: wait for the revision with all of them
        // (the monitoring segment's bridge on the real node) to be Complete.
        let samples = until(
            cluster,
            "the samples Complete on the four nodes, l2.103 on the real node",
            T,
            || async {
                let Some((name, _)) = newest(&revisions).await? else {
                    return Ok(None);
                };
                let rev = revisions.get(&name).await?;
                let done = rev.status.and_then(|s| s.phase).as_deref()
                    == Some(RevisionPhase::Complete.as_str())
                    && node_links().lines().any(|l| l.starts_with("l2.103"));
                Ok(done.then_some(name))
            },
        )
        .await?;
        let seq = revisions.get(&samples).await?.spec.sequence;
        eprintln!(
            "samples: {samples} Complete under {prev_version} in {:.1} s",
            t.elapsed().as_secs_f64()
        );

        // 2. Change A rolls out; once the real node (first in name order) runs it and the simulated
        // nodes are still to come, this tree is installed over the previous release.
        kubectl(cluster, &["apply", "-f", &segment(cluster, VLAN_A)?])?;
        let a = until(
            cluster,
            "change A Provisioned on the real node and still rolling",
            T,
            || async {
                let n = nnc.get(&node).await?;
                let st = n.status.clone().unwrap_or_default();
                let rev = revisions.get(&n.spec.revision).await?;
                let rolling = rev.spec.sequence > seq
                    && rev.status.and_then(|s| s.phase).as_deref()
                        == Some(RevisionPhase::Progressing.as_str());
                let here = st.observed_revision.as_deref() == Some(n.spec.revision.as_str())
                    && st.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && node_links().lines().any(|l| l.starts_with(&format!("l2.{VLAN_A}")));
                Ok((rolling && here).then_some(n.spec.revision.clone()))
            },
        )
        .await?;
        let kernel = kernel_state()?;
        let t = Instant::now();
        kubectl(cluster, &["apply", "-k", &installs.this])?;
        let (lead, agent) = rolled_to(cluster, &admin, THIS).await?;
        let a_phase = revisions.get(&a).await?.status.and_then(|s| s.phase);
        eprintln!(
            "upgraded to {THIS} in {:.1} s (leader {lead}, agent {agent}); change A {a} was {a_phase:?} then",
            t.elapsed().as_secs_f64()
        );
        assert_eq!(
            a_phase.as_deref(),
            Some(RevisionPhase::Progressing.as_str()),
            "change A is still rolling out when the {THIS} configurator leads (the three simulated \
             nodes answer it {SLOW:?} apart; here the upgrade took longer than all three)"
        );
        let writes = first_check_writes(cluster, &agent).await?;
        assert_eq!(
            writes, 0.0,
            "the {THIS} agent renders the config the node runs as {prev_version} did: it writes nothing"
        );
        let log = cluster.container_log(NS, &agent, "agent");
        assert!(
            log.contains("found the last good config on disk"),
            "the upgraded agent found its predecessor's backup:\n{log}"
        );
        let a_done = complete_after(cluster, &admin, seq, "change A Complete after the upgrade").await?;
        assert_eq!(a_done, a, "change A itself completed, no other revision was cut");
        assert_eq!(
            kernel_state()?,
            kernel,
            "the real node's kernel is as the {prev_version} agent left it"
        );
        check_frr_conf(&cluster.scratch_dir("frr"), &nnc.get(&node).await?.spec.config)?;
        let evpn = peer
            .evpn_up(cluster, "EVPN after the upgrade", Duration::from_secs(60))
            .await?;
        eprintln!(
            "change A Complete {:.1} s after the upgrade began, the real node's kernel unchanged, 0 netlink writes; {evpn}",
            t.elapsed().as_secs_f64()
        );
        pods_seen.extend([lead, agent]);

        // 3. Change B under this tree: every status written by its agents. (Each change adds a segment:
        // taking one away would bring back an earlier revision, which keeps its sequence.)
        let seq = revisions.get(&a).await?.spec.sequence;
        kubectl(cluster, &["apply", "-f", &segment(cluster, VLAN_A + 1)?])?;
        let b = complete_after(cluster, &admin, seq, &format!("change B Complete under {THIS}")).await?;
        let seq = revisions.get(&b).await?.spec.sequence;
        let st = nnc.get(&node).await?.status.unwrap_or_default();
        assert_eq!(st.agent_version.as_deref(), Some(THIS), "the real node's agent is {THIS}");

        // 4. An agent release whose rendering cuts the node off its peer (one blackhole route): the
        // DaemonSet's rolling update stops at the real node, which keeps exactly what it ran, and the
        // way back is `kubectl rollout undo`.
        let kernel = kernel_state()?;
        let refused = bad_agent_release(cluster, &admin, &b).await?;
        assert_eq!(kernel_state()?, kernel, "the node is back on exactly what it ran");
        let t = Instant::now();
        kubectl(cluster, &["-n", NS, "rollout", "undo", "daemonset/netwave-agent"])?;
        let (lead, agent) = rolled_to(cluster, &admin, THIS).await?;
        let writes = first_check_writes(cluster, &agent).await?;
        assert_eq!(writes, 0.0, "the agent rolled back to finds the node on its own rendering");
        assert_eq!(kernel_state()?, kernel, "the way back changes nothing on the node");
        eprintln!(
            "rollout undo: agent {agent} Ready {:.1} s later, 0 netlink writes, the kernel unchanged",
            t.elapsed().as_secs_f64()
        );
        pods_seen.extend([lead, agent, refused]);

        // 5. The downgrade: the previous release's manifests and CRDs over this tree's objects.
        let kernel = kernel_state()?;
        let t = Instant::now();
        kubectl(cluster, &["apply", "-k", &installs.prev])?;
        let (lead, agent) = rolled_to(cluster, &admin, prev_version).await?;
        let writes = first_check_writes(cluster, &agent).await?;
        assert_eq!(
            writes, 0.0,
            "the {prev_version} agent renders the config the node runs as {THIS} did: it writes nothing"
        );
        assert_eq!(
            kernel_state()?,
            kernel,
            "the real node's kernel is as the {THIS} agent left it"
        );
        eprintln!(
            "downgraded to {prev_version} in {:.1} s (leader {lead}, agent {agent}), the kernel unchanged, 0 netlink writes",
            t.elapsed().as_secs_f64()
        );
        pods_seen.extend([lead, agent]);

        // 6. Change C under the previous release, on objects and statuses this tree wrote.
        kubectl(cluster, &["apply", "-f", &segment(cluster, VLAN_A + 2)?])?;
        let c = complete_after(cluster, &admin, seq, &format!("change C Complete under {prev_version}"))
            .await?;
        let st = nnc.get(&node).await?.status.unwrap_or_default();
        assert_eq!(
            st.agent_version.as_deref(),
            Some(prev_version),
            "the real node's agent is {prev_version} again"
        );
        assert!(
            node_links().lines().any(|l| l.starts_with(&format!("l2.{}", VLAN_A + 2))),
            "change C is in the real node's kernel"
        );
        let evpn = peer
            .evpn_up(cluster, "EVPN after the downgrade", Duration::from_secs(60))
            .await?;
        eprintln!("change C {c} Complete under {prev_version}; {evpn}");
        Ok::<_, anyhow::Error>(())
    }
    .await;
    sims.stop(cluster).await;
    r?;

    // Nothing any netwave component of either version did was refused.
    assert_nothing_refused(cluster, &pods_seen);
    drop(installs);
    Ok(())
}
