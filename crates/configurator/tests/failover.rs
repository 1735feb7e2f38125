//! Two configurator *processes* (the real binary) against the real API server; the leader is SIGKILLed at a
//! different point of the rollout in every run. The standby must take over within the lease duration and
//! finish the rollout, with the DESIGN.md §3 invariants holding throughout.
//!
//! And a replica that cannot work lets go of the Lease (DESIGN §6): one whose service account cannot list
//! a kind it watches, and a leader whose reconcile task dies (the test-only `--fault-reconcile` hook of
//! the `fault-hooks` feature, which only this crate's tests build). The healthy replica takes over and
//! finishes the rollout; the broken one says why in one log line and in /readyz (and, when a restart
//! repairs it, in /healthz). An API server outage restarts no replica.

mod common;

use netwave_api::vocab::RevisionPhase;
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
    spawn_with(kubeconfig, identity, &[], Stdio::null())
}

/// [`spawn`] with more flags (a later flag overrides an earlier one) and its stderr going to `stderr`.
fn spawn_with(
    kubeconfig: &std::path::Path,
    identity: &str,
    extra: &[&str],
    stderr: impl Into<Stdio>,
) -> Proc {
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
        .args(netwave_configurator::testing::LOCAL_ENDPOINTS)
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("configurator binary starts");
    Proc {
        identity: identity.into(),
        child,
    }
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
                    [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(r.clone()),
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
/// the rollout completes with no node failed and the budget held. The outage outlasts the replicas'
/// `--cache-sync-timeout`: they say so in /readyz, but /healthz stays OK (a restart would only relist
/// everything into the same outage, both replicas at once).
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
    // A short sync bound, so the outage outlasts it: the replicas must stay alive through it anyway.
    let procs = [
        Watched::start(
            cp.kubeconfig(),
            "restart-a",
            &["--cache-sync-timeout", "2s"],
        ),
        Watched::start(
            cp.kubeconfig(),
            "restart-b",
            &["--cache-sync-timeout", "2s"],
        ),
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
    let (mut alive, mut not_ready) = (Vec::new(), Vec::new());
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(7) {
        for p in &procs {
            alive.push(http_get(p.health_port, "/healthz").await);
            match http_get(p.health_port, "/readyz").await {
                (200, _) => {}
                (_, why) => not_ready.push(why),
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    cp.restart_apiserver().await.unwrap();
    assert!(
        alive.iter().all(|a| a.0 == 200),
        "an API server outage longer than --cache-sync-timeout restarts no replica: {:?}",
        alive.iter().filter(|a| a.0 != 200).collect::<Vec<_>>()
    );
    assert!(
        not_ready.iter().any(|w| w.contains("watch")),
        "while it lasts, /readyz says which watch fails: {not_ready:?}"
    );

    let client = cp.client().await.unwrap();
    let rev = eventually(
        Duration::from_secs(90),
        "the rollout to complete",
        || async {
            match revisions(&client).await.as_slice() {
                [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(r.clone()),
                other => Err(format!(
                    "{:?}; nodes (spec revision and retry, status phase, observed revision and \
                     retry): {:?}; the replicas' logs end:\n{}",
                    other.iter().map(phase).collect::<Vec<_>>(),
                    configs(&client)
                        .await
                        .values()
                        .map(|c| {
                            let st = c.status.clone().unwrap_or_default();
                            let spec = (c.spec.revision.clone(), c.spec.retry);
                            (spec, st.phase, st.observed_revision, st.observed_retry)
                        })
                        .collect::<Vec<_>>(),
                    procs
                        .iter()
                        .map(|p| p.log_tail(12))
                        .collect::<Vec<_>>()
                        .join("\n")
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

/// The line a replica that cannot work logs, once per problem.
const LET_GO: &str = "cannot work as leader";

/// A replica whose stderr is kept in a file, with its health endpoint on a known port.
struct Watched {
    proc: Proc,
    log: tempfile::NamedTempFile,
    health_port: u16,
}

impl Watched {
    fn start(kubeconfig: &std::path::Path, identity: &str, extra: &[&str]) -> Watched {
        let log = tempfile::NamedTempFile::new().unwrap();
        let health_port = free_port();
        let health = format!("127.0.0.1:{health_port}");
        let mut args = vec!["--health-addr", health.as_str()];
        args.extend_from_slice(extra);
        let proc = spawn_with(kubeconfig, identity, &args, log.reopen().unwrap());
        Watched {
            proc,
            log,
            health_port,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }

    /// The last `n` lines of the log, for a failure message.
    fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Waits until `path` (/healthz or /readyz) fails; returns its answer.
    async fn failing(&self, path: &str) -> String {
        eventually(Duration::from_secs(30), "the probe to fail", || async {
            match http_get(self.health_port, path).await {
                (503, why) => Ok(why),
                other => Err(format!("{path}: {other:?}; log: {}", self.log())),
            }
        })
        .await
    }
}

/// Waits for the only revision to complete with every node updated and none failed.
async fn rollout_completes(env: &Env, nodes: u32) {
    let rev = eventually(
        Duration::from_secs(40),
        "the rollout to complete",
        || async {
            match revisions(&env.client).await.as_slice() {
                [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(r.clone()),
                other => Err(format!(
                    "{:?}; lease holder {:?}",
                    other.iter().map(phase).collect::<Vec<_>>(),
                    holder(env).await
                )),
            }
        },
    )
    .await;
    let st = rev.status.unwrap();
    assert_eq!((st.updated, st.failed), (nodes, 0), "{st:?}");
}

/// A service account with the configurator's RBAC (deploy/base/configurator.yaml) but without list and
/// watch on RoutingTables: a replica running under it can never sync that cache. Returns a kubeconfig.
async fn blind_kubeconfig(env: &Env, dir: &std::path::Path) -> std::path::PathBuf {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::PostParams;
    let pp = PostParams::default();
    let name = "netwave-configurator-blind";
    let subject = serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": "netwave-system"}]);
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "rules": [
            {"apiGroups": ["netwave.dev"], "resources": ["vrfrouteconfigurations", "layer2networkconfigurations", "bgppeerings", "mirrortargets", "mirrorselectors"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["netwave.dev"], "resources": ["routingtables"], "verbs": ["get"]},
            {"apiGroups": ["netwave.dev"], "resources": ["vrfrouteconfigurations/status", "layer2networkconfigurations/status", "routingtables/status", "networkconfigrevisions/status"], "verbs": ["patch"]},
            {"apiGroups": ["netwave.dev"], "resources": ["networkconfigrevisions", "nodenetworkconfigs"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
            {"apiGroups": ["netwave.dev"], "resources": ["networkconfiginputs"], "verbs": ["get", "list", "watch", "create", "delete"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
        ],
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subject,
    }))
    .unwrap();
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    let created = |r: Result<(), kube::Error>| match r {
        Ok(()) => {}
        Err(kube::Error::Api(ae)) if ae.code == 409 => {}
        Err(e) => panic!("creating the blind identity: {e}"),
    };
    created(
        Api::namespaced(env.client.clone(), "netwave-system")
            .create(&pp, &sa)
            .await
            .map(drop),
    );
    created(
        Api::all(env.client.clone())
            .create(&pp, &role)
            .await
            .map(drop),
    );
    created(
        Api::all(env.client.clone())
            .create(&pp, &binding)
            .await
            .map(drop),
    );
    let token = env
        .cp()
        .service_account_token(&env.client, "netwave-system", name, None)
        .await
        .unwrap();
    let path = dir.join("blind.kubeconfig");
    env.cp().write_kubeconfig(&path, &token).unwrap();
    path
}

/// A replica whose service account cannot list RoutingTables never syncs its caches. It held the Lease
/// (it led before its RBAC lost a rule, and restarted): it lets go instead of renewing a Lease it cannot
/// use, fails /readyz naming the kind (not /healthz: a restart cannot grant the rule), and the healthy
/// replica takes over and completes the rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_caches_cannot_sync_lets_go_and_the_healthy_one_completes_the_rollout() {
    let env = env().await;
    add_nodes(&env.client, &node_names(4)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(100));
    apply_samples(&env.client).await;
    let dir = tempfile::tempdir().unwrap();
    let blind_kc = blind_kubeconfig(&env, dir.path()).await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "netwave-system");
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "netwave-configurator"},
        "spec": {"holderIdentity": "blind", "leaseDurationSeconds": 2, "renewTime": now, "acquireTime": now},
    }))
    .unwrap();
    leases
        .create(&kube::api::PostParams::default(), &lease)
        .await
        .unwrap();

    let blind = Watched::start(&blind_kc, "blind", &["--cache-sync-timeout", "3s"]);
    let _healthy = spawn(&env.kubeconfig(), "healthy");
    rollout_completes(&env, 4).await;
    assert_eq!(holder(&env).await.as_deref(), Some("healthy"));
    let why = blind.failing("/readyz").await;
    assert!(
        why.contains("caches not synced") && why.contains("RoutingTable"),
        "{why}"
    );
    assert_eq!(
        http_get(blind.health_port, "/healthz").await,
        (200, "ok".to_string()),
        "a restart cannot grant a missing rule: the blind replica is not ready, but not restarted"
    );
    let lines = eventually(
        Duration::from_secs(10),
        "the blind replica's log line",
        || async {
            let log = blind.log();
            let lines: Vec<String> = log
                .lines()
                .filter(|l| l.contains(LET_GO))
                .map(String::from)
                .collect();
            if lines.is_empty() {
                Err(log)
            } else {
                Ok(lines)
            }
        },
    )
    .await;
    assert!(lines[0].contains("RoutingTable"), "{lines:?}");
    eprintln!("/readyz: {why}\nlog: {}", lines[0]);
    assert_eq!(
        holder(&env).await.as_deref(),
        Some("healthy"),
        "the blind replica never takes it back"
    );
    assert_eq!(
        blind.log().lines().filter(|l| l.contains(LET_GO)).count(),
        1,
        "one line per problem:\n{}",
        blind.log()
    );
    drop(blind.proc);
}

/// A leader whose reconcile task dies (panics, or returns) renews nothing any more: it lets go of the
/// Lease at once, fails /healthz, and the standby takes over and completes the rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_reconcile_task_dies_lets_go_and_the_standby_completes_the_rollout() {
    for fault in ["panic", "return"] {
        let env = env().await;
        add_nodes(&env.client, &node_names(4)).await;
        let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(100));
        apply_samples(&env.client).await;
        let kubeconfig = env.kubeconfig();
        let dying = Watched::start(&kubeconfig, "dying", &["--fault-reconcile", fault]);
        eventually(
            Duration::from_secs(20),
            "the dying replica to lead",
            || async {
                match holder(&env).await {
                    Some(h) if h == "dying" => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        let _standby = spawn(&kubeconfig, "standby");
        rollout_completes(&env, 4).await;
        assert_eq!(holder(&env).await.as_deref(), Some("standby"), "{fault}");
        let why = dying.failing("/healthz").await;
        assert!(why.contains("reconcile loop ended"), "{fault}: {why}");
        let log = dying.log();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(LET_GO)).collect();
        assert!(
            lines.len() == 1 && lines[0].contains("released the Lease"),
            "{fault}: one line saying it let go:\n{log}"
        );
        eprintln!("{fault}: /healthz: {why}\nlog: {}", lines[0]);
        drop(dying.proc);
    }
}
