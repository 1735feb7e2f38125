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
use netwave_e2e::fleet::{ApiServer, Bins, Fleet, FleetOptions, workspace_root};
use netwave_e2e::install::metric_at;
use netwave_e2e::netns::is_root;
use serde_json::json;

const T: Duration = Duration::from_secs(180);
const THIS: &str = env!("CARGO_PKG_VERSION");

/// The previous release's directory (bin/, crds/, build-info), built on first use.
fn previous_release() -> Result<PathBuf> {
    let out = std::process::Command::new("bash")
        .arg(workspace_root().join("tests/previous-release/build.sh"))
        .output()
        .context("running tests/previous-release/build.sh")?;
    if !out.status.success() {
        bail!(
            "building the previous release failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dir = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    eprintln!(
        "previous release: {}",
        std::fs::read_to_string(dir.join("build-info"))?.trim()
    );
    Ok(dir)
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
    if !is_root() {
        eprintln!("SKIPPED: end-to-end tests need root (network namespaces, netlink)");
        return;
    }
    let prev = previous_release().expect("the previous release builds");
    let this = Bins::build().expect("netwave binaries build");
    let old = Bins {
        agent: prev.join("bin/netwave-agent"),
        configurator: prev.join("bin/netwave-configurator"),
        testbed: prev.join("bin/netwave-testbed"),
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
