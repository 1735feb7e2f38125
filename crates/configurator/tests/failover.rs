//! Two configurator *processes* (the real binary) against the real API server; the leader is SIGKILLed at a
//! different point of the rollout in every run. The standby must take over within the lease duration and
//! finish the rollout, with the DESIGN.md §3 invariants holding throughout.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(2);
const RUNS: u64 = 20;

/// A configurator process, killed on drop (a failing test must not leave processes behind).
struct Proc {
    identity: String,
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(kubeconfig: &std::path::Path, identity: &str) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_netwave-configurator"))
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args([
            "--identity",
            identity,
            "--lease-namespace",
            "netwave-system",
        ])
        .args([
            "--lease-duration",
            "2s",
            "--renew-deadline",
            "1500ms",
            "--retry-period",
            "250ms",
        ])
        .args(["--max-unavailable", "2", "--resync-interval", "2s"])
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
            "--log-format",
            "text",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("configurator binary starts");
    Proc {
        identity: identity.into(),
        child,
    }
}

async fn holder(env: &Env) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "netwave-system");
    leases
        .get_opt("netwave-configurator")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_the_leader_at_any_point_and_the_standby_finishes() {
    let mut takeovers = Vec::new();
    for run in 0..RUNS {
        let env = env().await;
        let names = node_names(6);
        add_nodes(&env.client, &names).await;
        let history = History::record(&env.client);
        let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(120));
        apply_samples(&env.client).await;
        let kubeconfig = env.kubeconfig();
        let mut procs = vec![
            spawn(&kubeconfig, &format!("r{run}-a")),
            spawn(&kubeconfig, &format!("r{run}-b")),
        ];

        // A different point of the rollout each run: from before the first write to the last wave.
        let kill_after = Duration::from_millis(150 + (run * 173) % 1600);
        let leader = eventually(Duration::from_secs(20), "a leader", || async {
            holder(&env)
                .await
                .filter(|h| !h.is_empty())
                .ok_or_else(|| "none".to_string())
        })
        .await;
        tokio::time::sleep(kill_after).await;
        let leader = holder(&env).await.unwrap_or(leader);
        let idx = procs
            .iter()
            .position(|p| p.identity == leader)
            .expect("the holder is one of ours");
        let mut killed = procs.remove(idx);
        killed.child.kill().unwrap(); // SIGKILL: no lease release, no cleanup
        killed.child.wait().unwrap();
        let killed_at = Instant::now();
        // The replacement replica comes up as the new standby, as a Deployment would restart it.
        procs.push(spawn(&kubeconfig, &format!("r{run}-c")));

        let took_over = eventually(
            Duration::from_secs(20),
            "the standby to take the lease",
            || async {
                match holder(&env).await {
                    Some(h) if h != leader && !h.is_empty() => Ok(killed_at.elapsed()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        takeovers.push(took_over);
        assert!(
            took_over <= LEASE + Duration::from_millis(1500),
            "run {run}: takeover took {took_over:?} (lease {LEASE:?})"
        );

        let rev = eventually(
            Duration::from_secs(60),
            "the rollout to complete",
            || async {
                match revisions(&env.client).await.as_slice() {
                    [r] if phase(r) == "Complete" => Ok(r.clone()),
                    other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
                }
            },
        )
        .await;
        let st = rev.status.unwrap();
        assert_eq!((st.updated, st.failed), (6, 0), "run {run}: {st:?}");
        assert!(
            st.failed_nodes.is_empty(),
            "run {run}: a leader change is not a node failure"
        );
        let max = history.max_in_flight();
        assert!(
            max <= 2,
            "run {run}: {max} nodes in flight (killed after {kill_after:?})"
        );
        let configs = configs(&env.client).await;
        assert!(
            configs.values().all(|c| !in_flight(c)),
            "run {run}: every node settled"
        );
    }
    takeovers.sort();
    eprintln!(
        "takeover after SIGKILL over {RUNS} runs: min {:?}, median {:?}, max {:?} (lease {LEASE:?})",
        takeovers[0],
        takeovers[takeovers.len() / 2],
        takeovers[takeovers.len() - 1]
    );
}

/// The API server itself goes away mid-rollout (stopped, as a control-plane upgrade does, and started again
/// on the same etcd): an interruption, never a failure. The configurator process and the agents reconnect,
/// the rollout completes with no node failed and the budget held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_restarting_mid_rollout_is_an_interruption_not_a_failure() {
    use netwave_control_plane::{ControlPlane, Options};
    let mut cp = ControlPlane::start(Options::default()).await.unwrap();
    let client = prepare(&cp).await;
    let names = node_names(8);
    add_nodes(&client, &names).await;
    let history = History::record(&client);
    // Slow agents, so the outage lands in the middle of the rollout.
    let _agents = spawn_agents(client.clone(), always_ok(), Duration::from_millis(700));
    apply_samples(&client).await;
    let _procs = [
        spawn(cp.kubeconfig(), "restart-a"),
        spawn(cp.kubeconfig(), "restart-b"),
    ];

    let provisioned = |cs: &std::collections::BTreeMap<String, netwave_api::NodeNetworkConfig>| {
        cs.values().filter(|c| !in_flight(c)).count()
    };
    eventually(
        Duration::from_secs(60),
        "the first nodes to be updated",
        || async {
            let n = provisioned(&configs(&client).await);
            if (1..8).contains(&n) {
                Ok(())
            } else {
                Err(format!("{n} updated"))
            }
        },
    )
    .await;
    let before = provisioned(&configs(&client).await);
    cp.stop_apiserver();
    tokio::time::sleep(Duration::from_secs(3)).await;
    cp.restart_apiserver().await.unwrap();

    let client = cp.client().await.unwrap();
    let rev = eventually(
        Duration::from_secs(90),
        "the rollout to complete",
        || async {
            match revisions(&client).await.as_slice() {
                [r] if phase(r) == "Complete" => Ok(r.clone()),
                other => Err(format!(
                    "{:?}; nodes (spec revision, status phase, observed revision): {:?}",
                    other.iter().map(phase).collect::<Vec<_>>(),
                    configs(&client)
                        .await
                        .values()
                        .map(|c| {
                            let st = c.status.clone().unwrap_or_default();
                            (c.spec.revision.clone(), st.phase, st.observed_revision)
                        })
                        .collect::<Vec<_>>()
                )),
            }
        },
    )
    .await;
    let st = rev.status.unwrap();
    assert_eq!((st.updated, st.failed), (8, 0), "{st:?}");
    assert!(
        st.failed_nodes.is_empty(),
        "an API outage is not a node failure: {st:?}"
    );
    assert!(
        before < 8,
        "the outage came mid-rollout ({before} of 8 updated before it)"
    );
    let max = history.max_in_flight();
    assert!(max <= 2, "{max} nodes in flight across the restart");
}
