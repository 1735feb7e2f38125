//! Releases meet (#46): the previous release (the newest entry of `releases.toml`, built from its commit
//! by `tests/previous-release/build.sh` and cached outside the repository) and this tree in one fleet on
//! kube-apiserver + etcd: agents of both releases under this tree's configurators, the agents upgraded
//! one by one while a rollout is in flight, then the configurators downgraded to the previous release
//! and the previous release's CRDs installed over the objects this tree wrote. On the way, a revision that
//! needs a feature the previous release's agents lack reaches only the upgraded agent's node; the others
//! wait for their agent. Needs root (skips with a message otherwise).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use netwave_api::NodeNetworkConfig;
use netwave_api::manifest::samples;
use netwave_api::vocab::RevisionPhase;
use netwave_e2e::fleet::{ApiServer, Bins, Fleet, FleetOptions};
use netwave_e2e::install::{metric_at, previous_release};
use netwave_e2e::netns::is_root;
use serde_json::json;

const T: Duration = Duration::from_secs(180);
const THIS: &str = env!("CARGO_PKG_VERSION");

/// The previous release's binaries, this tree's, and the previous release's directory (its CRDs);
/// `None` (the test skips, saying so) without root.
fn releases() -> Option<(Bins, Bins, PathBuf)> {
    if !is_root() {
        eprintln!("SKIPPED: end-to-end tests need root (network namespaces, netlink)");
        return None;
    }
    let prev = previous_release("build.sh").expect("the previous release builds");
    let this = Bins::build().expect("netwave binaries build");
    let old = Bins {
        agent: prev.join("bin/netwave-agent"),
        configurator: prev.join("bin/netwave-configurator"),
        testbed: prev.join("bin/netwave-testbed"),
    };
    Some((old, this, prev))
}

/// The version each node's agent reports (`status.agentVersion`).
async fn agent_versions(f: &Fleet) -> Result<Vec<(String, String)>> {
    Ok(f.configs()
        .await?
        .into_iter()
        .map(|(n, c)| {
            let v = c.status.and_then(|s| s.agent_version).unwrap_or_default();
            (n, v)
        })
        .collect())
}

/// Rolls out one more RoutingTable (a new revision touching every node) and waits for it to complete
/// with no node failed; returns its name.
async fn roll_out_table(f: &Fleet, name: &str, id: u32) -> Result<String> {
    let seq = f.revisions().await?.last().map_or(0, |r| r.spec.sequence);
    f.create_routing_table(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": name},
        "spec": {"tableId": id, "routes": [{"prefix": "198.19.0.0/16", "type": "blackhole"}]},
    }))
    .await?;
    let rev = f.wait_new_revision(seq, T).await?;
    let name = rev.metadata.name.context("a named revision")?;
    complete(f, &name).await?;
    Ok(name)
}

/// Waits for `rev` to be Complete with no node failed and every node on it.
async fn complete(f: &Fleet, rev: &str) -> Result<()> {
    let done = f
        .wait_phase(rev, &[RevisionPhase::Complete, RevisionPhase::Failed], T)
        .await?;
    let st = done.status.unwrap_or_default();
    if st.phase.as_deref() != Some(RevisionPhase::Complete.as_str()) || st.failed != 0 {
        bail!("{rev}: {:?}, failed nodes {:?}", st.phase, st.failed_nodes);
    }
    f.wait_all_on(rev, T).await
}

/// Creates a RoutingTable whose rule matches a firewall mark (a feature since 0.2.0); returns the
/// revision cut from it.
async fn fwmark_revision(f: &Fleet) -> Result<String> {
    let seq = f.revisions().await?.last().map_or(0, |r| r.spec.sequence);
    f.create_routing_table(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "skew-fwmark"},
        "spec": {"tableId": 313,
                 "routes": [{"prefix": "198.19.0.0/16", "type": "blackhole"}],
                 "rules": [{"priority": 4000, "fwmark": 16, "fwmask": 255}]},
    }))
    .await?;
    let rev = f.wait_new_revision(seq, T).await?;
    rev.metadata.name.context("a named revision")
}

/// The previous release's CRDs put over this tree's (as `kubectl apply` of the older install would).
async fn install_crds(f: &Fleet, dir: &std::path::Path) -> Result<usize> {
    let api: Api<CustomResourceDefinition> = Api::all(f.client.clone());
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let mut crd: CustomResourceDefinition = serde_saphyr::from_str(&text)
            .with_context(|| format!("{} is no CRD", path.display()))?;
        let name = crd.metadata.name.clone().context("a named CRD")?;
        crd.metadata.resource_version = api.get(&name).await?.metadata.resource_version;
        api.replace(&name, &PostParams::default(), &crd).await?;
        n += 1;
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_release_and_this_tree_upgrade_and_downgrade_each_other_without_a_failure() {
    let Some((old, this, prev)) = releases() else {
        return;
    };
    let _g = Fleet::lock().await;
    // This tree's configurators, the previous release's agents.
    let mut f = Fleet::start(
        Bins {
            agent: old.agent.clone(),
            ..this.clone()
        },
        FleetOptions {
            nodes: 4,
            server: ApiServer::Real,
            ..FleetOptions::default()
        },
    )
    .await
    .expect("fleet starts");
    f.apply(&samples().unwrap()).await.unwrap();
    let first = f
        .wait_latest(0, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    f.wait_all_on(first.metadata.name.as_deref().unwrap(), T)
        .await
        .unwrap();
    let versions = agent_versions(&f).await.unwrap();
    let old_version = versions[0].1.clone();
    assert!(
        old_version != THIS && versions.iter().all(|(_, v)| *v == old_version),
        "every agent is the previous release: {versions:?}"
    );

    // One agent upgraded, then a revision whose config needs a feature the previous release's agents
    // lack (a rule matching a firewall mark): only that node gets it; the others wait for their agent,
    // neither failed nor Provisioned on a config they would apply in part.
    let upgraded = f.node_names()[0].clone();
    f.bins.agent = this.agent.clone();
    f.kill_agent(&upgraded);
    f.start_agent(&upgraded).unwrap();
    let needs_new_agent = fwmark_revision(&f).await.unwrap();
    let st = f
        .wait_phase(&needs_new_agent, &[RevisionPhase::Complete], T)
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    assert_eq!(
        (st.updated, st.waiting_for_agent, st.failed),
        (1, 3, 0),
        "{:?}",
        st.message
    );
    let message = st.message.unwrap_or_default();
    assert!(
        message.contains("3 node(s) wait for their agent") && message.contains("ruleFwmark"),
        "{message}"
    );
    for (node, c) in f.configs().await.unwrap() {
        let on_it = c.spec.revision == needs_new_agent;
        let reported = c.status.and_then(|s| s.observed_revision) == Some(needs_new_agent.clone());
        assert_eq!(
            (on_it, reported),
            (node == upgraded, node == upgraded),
            "{node}: only the upgraded agent's node is given (and reports on) {needs_new_agent}"
        );
    }

    // A rollout in flight while the agents are upgraded one by one, as the DaemonSet does.
    let seq = f.revisions().await.unwrap().last().unwrap().spec.sequence;
    f.create_routing_table(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "skew-upgrade"},
        "spec": {"tableId": 310, "routes": [{"prefix": "198.19.0.0/16", "type": "blackhole"}]},
    }))
    .await
    .unwrap();
    let in_flight = f.wait_new_revision(seq, T).await.unwrap();
    f.bins.agent = this.agent.clone();
    for node in f.node_names() {
        f.kill_agent(&node);
        f.start_agent(&node).unwrap();
        let addr = f.agent_metrics_addr(&node).unwrap();
        // Its rendering of what the node runs is the previous release's: the gate has nothing to apply.
        let gated = f
            .eventually(T, &format!("{node}'s new agent up"), || async {
                let applied = metric_at(addr, "netwave_agent_upgrade_applies_total").await;
                let refused = metric_at(addr, "netwave_agent_upgrade_refused").await;
                match (applied, refused) {
                    (Ok(a), Ok(r)) => Ok((a, r)),
                    (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
                }
            })
            .await
            .unwrap();
        assert_eq!(gated, (0.0, 0.0), "{node}: nothing rendered differently");
    }
    complete(&f, in_flight.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    let versions = agent_versions(&f).await.unwrap();
    assert!(
        versions.iter().all(|(_, v)| v == THIS),
        "every agent is this tree's now: {versions:?}"
    );

    // Before going back, the input that needs this release's agents goes (README, "Upgrading
    // netwave": an older agent given such a config would apply it in part).
    let seq = f.revisions().await.unwrap().last().unwrap().spec.sequence;
    f.delete_routing_table("skew-fwmark").await.unwrap();
    let without = f.wait_new_revision(seq, T).await.unwrap();
    complete(&f, without.metadata.name.as_deref().unwrap())
        .await
        .unwrap();

    // The configurators go back to the previous release (a Deployment rollback), over objects this
    // tree wrote; half the agents go back too.
    for i in 0..2 {
        f.stop_configurator(i);
    }
    f.bins.configurator = old.configurator.clone();
    for i in 0..2 {
        f.start_configurator(i).unwrap();
    }
    f.bins.agent = old.agent.clone();
    for node in f.node_names().into_iter().take(2) {
        f.kill_agent(&node);
        f.start_agent(&node).unwrap();
    }
    roll_out_table(&f, "skew-downgrade", 311)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", f.logs_tail(30)));

    // The previous release's CRDs installed over it all: every status stays writable (the agents'
    // reports of the next rollout), and every object still lists.
    let n = install_crds(&f, &prev.join("crds")).await.unwrap();
    assert!(n >= 9, "the previous release's CRDs: {n}");
    roll_out_table(&f, "skew-old-crds", 312)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", f.logs_tail(30)));
    let listed = Api::<NodeNetworkConfig>::all(f.client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 4);
}

/// One thing an upgrade or a downgrade does.
#[derive(Clone, Debug)]
enum Step {
    /// The agent of this node replaced by this binary (a DaemonSet pod replaced).
    Agent(String, PathBuf),
    /// Configurator replica `i` replaced by this binary (a Deployment pod replaced).
    Configurator(usize, PathBuf),
    /// A new RoutingTable: a rollout starts while the step after it runs.
    Table(String, u32),
}

/// A small deterministic generator (splitmix64), so a seed replays the same kills.
struct Chaos(u64);

impl Chaos {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What runs where, so a killed process comes back as the same binary (as its pod would).
struct Running {
    agents: std::collections::BTreeMap<String, PathBuf>,
    configurators: Vec<PathBuf>,
}

async fn restart_agent(f: &mut Fleet, run: &Running, node: &str) -> Result<()> {
    f.kill_agent(node);
    f.bins.agent = run.agents[node].clone();
    f.start_agent(node)?;
    Ok(())
}

fn restart_configurator(f: &mut Fleet, run: &Running, i: usize) -> Result<()> {
    f.stop_configurator(i);
    f.bins.configurator = run.configurators[i].clone();
    f.start_configurator(i)
}

/// Runs `steps`, killing a component (the Lease holder, or an agent: chosen by `chaos`) after each of
/// `kills` steps chosen by `chaos` and starting it again at once, as Kubernetes restarts a pod.
/// Returns what was killed, in words.
async fn run_with_kills(
    f: &mut Fleet,
    run: &mut Running,
    steps: &[Step],
    kills: usize,
    chaos: &mut Chaos,
) -> Result<Vec<String>> {
    let mut at = std::collections::BTreeSet::new();
    while at.len() < kills.min(steps.len()) {
        at.insert(chaos.below(steps.len()));
    }
    let mut killed = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Agent(node, bin) => {
                run.agents.insert(node.clone(), bin.clone());
                restart_agent(f, run, node).await?;
            }
            Step::Configurator(c, bin) => {
                run.configurators[*c] = bin.clone();
                restart_configurator(f, run, *c)?;
            }
            Step::Table(name, id) => {
                f.create_routing_table(json!({
                    "apiVersion": "netwave.dev/v1alpha1",
                    "kind": "RoutingTable",
                    "metadata": {"name": name},
                    "spec": {"tableId": id,
                             "routes": [{"prefix": "198.19.0.0/16", "type": "blackhole"}]},
                }))
                .await?;
            }
        }
        // Somewhere within the next two seconds of what the step set off.
        tokio::time::sleep(Duration::from_millis(chaos.below(2000) as u64)).await;
        if !at.contains(&i) {
            continue;
        }
        if chaos.below(2) == 0 {
            let leader = f.kill_leader().await?;
            let c: usize = leader.trim_start_matches("configurator-").parse()?;
            restart_configurator(f, run, c)?;
            killed.push(format!("after step {i} ({step:?}): the leader {leader}"));
        } else {
            let nodes = f.node_names();
            let node = nodes[chaos.below(nodes.len())].clone();
            restart_agent(f, run, &node).await?;
            killed.push(format!("after step {i} ({step:?}): the agent of {node}"));
        }
    }
    Ok(killed)
}

/// The newest revision is Complete, no revision failed, every node runs the newest one and no agent
/// reports Invalid: nothing is left for a human.
async fn settled(f: &Fleet) -> Result<String> {
    let newest = || async {
        let latest = f.wait_latest(0, &RevisionPhase::ALL, T).await?;
        latest.metadata.name.context("a named revision")
    };
    // Until no newer revision is cut meanwhile (a change made last settles for 2 s before its cut).
    let mut name = newest().await?;
    loop {
        complete(f, &name).await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = newest().await?;
        if now == name {
            break;
        }
        name = now;
    }
    let failed: Vec<String> = (f.revisions().await?.into_iter())
        .filter(|r| {
            r.status.as_ref().and_then(|s| s.phase.as_deref())
                == Some(RevisionPhase::Failed.as_str())
        })
        .filter_map(|r| r.metadata.name)
        .collect();
    if !failed.is_empty() {
        bail!("revisions failed: {failed:?}");
    }
    let invalid: Vec<String> = (f.configs().await?.into_iter())
        .filter(|(_, c)| {
            c.status.as_ref().and_then(|s| s.phase.as_deref())
                == Some(netwave_api::vocab::NodePhase::Invalid.as_str())
        })
        .map(|(n, _)| n)
        .collect();
    if !invalid.is_empty() {
        bail!("nodes report Invalid: {invalid:?}");
    }
    Ok(name)
}

/// #46 done-when: killing either component at 5 random points of an upgrade and of a downgrade ends
/// with every node on a complete revision and no error that needs a human. The kills are drawn from a
/// seed (printed; `NETWAVE_CHAOS_SEED` replays one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_either_component_during_an_upgrade_or_a_downgrade_settles_without_a_human() {
    let Some((old, this, _)) = releases() else {
        return;
    };
    let (old_agent, old_configurator) = (old.agent.clone(), old.configurator.clone());
    let seed = std::env::var("NETWAVE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(46);
    eprintln!("chaos seed {seed} (NETWAVE_CHAOS_SEED replays it)");
    let mut chaos = Chaos(seed);
    let _g = Fleet::lock().await;
    // The previous release everywhere.
    let mut f = Fleet::start(
        Bins {
            agent: old_agent.clone(),
            configurator: old_configurator.clone(),
            ..this.clone()
        },
        FleetOptions {
            nodes: 4,
            server: ApiServer::Real,
            ..FleetOptions::default()
        },
    )
    .await
    .expect("fleet starts");
    let mut run = Running {
        agents: (f.node_names().into_iter())
            .map(|n| (n, old_agent.clone()))
            .collect(),
        configurators: vec![old_configurator.clone(); 2],
    };
    f.apply(&samples().unwrap()).await.unwrap();
    let or_logs = |f: &Fleet, e: anyhow::Error| -> String { format!("{e:#}\n{}", f.logs_tail(30)) };
    settled(&f)
        .await
        .unwrap_or_else(|e| panic!("{}", or_logs(&f, e)));

    // Upgrade: configurators, then agents one by one, with rollouts in flight.
    let nodes = f.node_names();
    let mut upgrade = vec![
        Step::Configurator(0, this.configurator.clone()),
        Step::Table("chaos-up-1".into(), 320),
        Step::Configurator(1, this.configurator.clone()),
    ];
    upgrade.extend((nodes.iter()).map(|n| Step::Agent(n.clone(), this.agent.clone())));
    upgrade.insert(5, Step::Table("chaos-up-2".into(), 321));
    let killed = run_with_kills(&mut f, &mut run, &upgrade, 5, &mut chaos)
        .await
        .unwrap_or_else(|e| panic!("{}", or_logs(&f, e)));
    eprintln!("upgrade, killed: {killed:#?}");
    let up = settled(&f)
        .await
        .unwrap_or_else(|e| panic!("after the upgrade: {}", or_logs(&f, e)));
    let versions = agent_versions(&f).await.unwrap();
    assert!(
        versions.iter().all(|(_, v)| v == THIS),
        "every agent is this tree's after the upgrade ({up}): {versions:?}"
    );

    // Downgrade: the same the other way.
    let mut downgrade = vec![
        Step::Configurator(1, old_configurator.clone()),
        Step::Table("chaos-down-1".into(), 322),
        Step::Configurator(0, old_configurator.clone()),
    ];
    downgrade.extend((nodes.iter().rev()).map(|n| Step::Agent(n.clone(), old_agent.clone())));
    downgrade.insert(5, Step::Table("chaos-down-2".into(), 323));
    let killed = run_with_kills(&mut f, &mut run, &downgrade, 5, &mut chaos)
        .await
        .unwrap_or_else(|e| panic!("{}", or_logs(&f, e)));
    eprintln!("downgrade, killed: {killed:#?}");
    settled(&f)
        .await
        .unwrap_or_else(|e| panic!("after the downgrade: {}", or_logs(&f, e)));
}
