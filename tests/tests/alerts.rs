//! The alerts `deploy/monitoring/prometheusrule.yaml` ships, proven twice:
//!
//! - `promtool test rules` runs the cases of `deploy/monitoring/tests/alerts.test.yaml` against the rule
//!   groups extracted from the PrometheusRule (the one copy of the rules), and every alert must have a
//!   case where it fires and one where it stays quiet;
//! - a real Prometheus scrapes a fleet (API server, configurator, agents in node namespaces) while a
//!   revision fails on one node and the configurator is then stopped, and its HTTP API must show the
//!   alerts an operator would get.
//!
//! promtool and prometheus come from Debian's `prometheus` package: without them these tests fail with
//! one line saying how to install it (they never skip for that). The fleet test needs root (skips with a
//! message otherwise, like the other end-to-end tests).

use netwave_api::vocab::RevisionPhase;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use netwave_api::manifest::samples;
use netwave_e2e::fleet::{Bins, Fleet, FleetOptions, PROBE_TARGET};
use netwave_e2e::netns::is_root;
use netwave_e2e::prometheus::{
    Alert, Prometheus, Targets, alert_names, binary, prometheus_rule_path, rule_file,
    rule_tests_path,
};
use serde_json::{Value, json};

/// For each alert named in a promtool test file: (has a case where it fires, has one where it is quiet).
fn coverage(tests: &Value) -> BTreeMap<String, (bool, bool)> {
    let mut out: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for t in tests["tests"].as_array().into_iter().flatten() {
        for case in t["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap_or_default().to_string();
            let fires = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            let e = out.entry(name).or_default();
            if fires {
                e.0 = true;
            } else {
                e.1 = true;
            }
        }
    }
    out
}

#[test]
fn promtool_unit_tests_pass_and_every_alert_fires_in_one_case_and_stays_quiet_in_another() {
    let promtool = binary("promtool").unwrap_or_else(|e| panic!("{e:#}"));
    let rules = rule_file(&prometheus_rule_path()).unwrap_or_else(|e| panic!("{e:#}"));
    let alerts = alert_names(&rules);
    assert!(alerts.len() >= 10, "{alerts:?}");
    let path = rule_tests_path();
    let mut tests: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));

    let covered = coverage(&tests);
    let mut gaps = Vec::new();
    for a in &alerts {
        match covered.get(a) {
            None => gaps.push(format!("{a}: no case")),
            Some((false, _)) => gaps.push(format!("{a}: no case where it fires")),
            Some((_, false)) => gaps.push(format!("{a}: no case where it stays quiet")),
            Some(_) => {}
        }
    }
    let known: BTreeSet<&String> = alerts.iter().collect();
    for a in covered.keys().filter(|a| !known.contains(a)) {
        gaps.push(format!(
            "{a}: tested, but the PrometheusRule has no such alert"
        ));
    }
    assert!(gaps.is_empty(), "{}: {}", path.display(), gaps.join("; "));

    // promtool reads the extracted groups (JSON is YAML) next to the cases.
    let dir = std::env::temp_dir().join(format!("netwave-promtool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rules.json"),
        serde_json::to_vec_pretty(&rules).unwrap(),
    )
    .unwrap();
    tests["rule_files"] = json!(["rules.json"]);
    std::fs::write(
        dir.join("alerts.test.json"),
        serde_json::to_vec_pretty(&tests).unwrap(),
    )
    .unwrap();
    let out = Command::new(&promtool)
        .current_dir(&dir)
        .args(["test", "rules", "alerts.test.json"])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", promtool.display()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("SUCCESS"),
        "promtool test rules on {} failed:\n{text}",
        path.display()
    );
}

const T: Duration = Duration::from_secs(120);

fn bins() -> Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| Bins::build().expect("netwave binaries build"))
        .clone()
}

/// A routing table that blackholes the probe target of `node` only: its agent's ICMP probe fails after
/// the apply, it restores the last good config and reports Invalid, and the revision fails.
fn blackhole_probe_target(node: &str) -> Value {
    json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "bad-monitoring"},
        "spec": {
            "tableId": 300,
            "routes": [{"prefix": format!("{PROBE_TARGET}/32"), "type": "blackhole"}],
            "rules": [{"to": format!("{PROBE_TARGET}/32"), "priority": 300}],
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        }
    })
}

fn summary(alerts: &[Alert]) -> String {
    let lines: Vec<String> = alerts
        .iter()
        .map(|a| format!("{} {} {:?}", a.name, a.state, a.labels))
        .collect();
    format!("[{}]", lines.join("; "))
}

/// Waits until `check` accepts Prometheus's active alerts; fails with them and both sides' logs.
async fn wait_alerts<R>(
    f: &Fleet,
    prom: &Prometheus,
    what: &str,
    check: impl Fn(&[Alert]) -> Option<R>,
) -> R {
    f.eventually(T, what, || async {
        let alerts = prom.alerts().await.map_err(|e| format!("{e:#}"))?;
        check(&alerts).ok_or_else(|| {
            format!(
                "alerts: {}\n--- prometheus\n{}",
                summary(&alerts),
                prom.log_tail(5)
            )
        })
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scraping_a_fleet_fires_the_failed_revision_alerts_and_sees_no_configurator_up()
{
    if !is_root() {
        eprintln!("SKIPPED: end-to-end tests need root (network namespaces, netlink)");
        return;
    }
    // Before anything is started: a missing Prometheus fails here with how to install it.
    binary("prometheus").unwrap_or_else(|e| panic!("{e:#}"));
    let rules = rule_file(&prometheus_rule_path()).unwrap_or_else(|e| panic!("{e:#}"));
    let bins = bins();
    let _g = Fleet::lock().await;
    let t0 = Instant::now();
    let mut f = Fleet::start(
        bins,
        FleetOptions {
            nodes: 3,
            configurators: 1,
            ..FleetOptions::default()
        },
    )
    .await
    .expect("fleet starts");
    let nodes = f.node_names();
    let agent = |n: &str| f.agent_metrics_addr(n).unwrap().to_string();
    let targets = Targets {
        configurators: f.configurator_metrics_addrs(),
        agents: nodes
            .iter()
            .map(|n| f.agent_metrics_addr(n).unwrap())
            .collect(),
    };
    let prom = Prometheus::start(
        &std::env::temp_dir().join(format!("{}-prometheus", f.net.run_id)),
        &rules,
        &targets,
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    let started = t0.elapsed();

    // A healthy fleet: every target scraped, a leader, the samples rolled out, nothing firing and
    // neither failure alert even pending.
    f.apply(&samples().unwrap()).await.unwrap();
    let good = f
        .wait_latest(0, &[RevisionPhase::Complete], T)
        .await
        .unwrap();
    f.wait_all_on(good.metadata.name.as_deref().unwrap(), T)
        .await
        .unwrap();
    f.eventually(T, "every target up and a leader in Prometheus", || async {
        let t = prom.targets().await.map_err(|e| format!("{e:#}"))?;
        let up = t.iter().filter(|(_, _, h)| h == "up").count();
        let leader = prom
            .query("max(netwave_leader)")
            .await
            .map_err(|e| format!("{e:#}"))?;
        let leads = leader
            .first()
            .is_some_and(|s| s["value"][1].as_str() == Some("1"));
        if up == 1 + nodes.len() && t.len() == up && leads {
            Ok(())
        } else {
            Err(format!("targets {t:?}, max(netwave_leader) {leader:?}"))
        }
    })
    .await
    .unwrap();
    let rolled_out = t0.elapsed();
    // Two evaluations after the scrapes above.
    prom.evaluations_pass(2).await.unwrap();
    let alerts = prom.alerts().await.unwrap();
    assert!(
        alerts.iter().all(|a| a.state != "firing"
            && a.name != "NetwaveRevisionFailed"
            && a.name != "NetwaveAgentApplyFailures"),
        "healthy fleet: {}",
        summary(&alerts)
    );

    // node-2's probe target is blackholed: its agent reports Invalid, the revision fails.
    let seq = f.revisions().await.unwrap().last().unwrap().spec.sequence;
    f.create_routing_table(blackhole_probe_target("node-2"))
        .await
        .unwrap();
    let failed = f
        .wait_latest(seq, &[RevisionPhase::Failed], T)
        .await
        .unwrap();
    let failed_at = Instant::now();
    assert_eq!(failed.status.unwrap().failed_nodes[0].node, "node-2");
    let bad_agent = agent("node-2");
    wait_alerts(
        &f,
        &prom,
        "NetwaveRevisionFailed and NetwaveAgentApplyFailures (node-2 only) firing",
        |alerts| {
            let firing = |name: &str| {
                alerts
                    .iter()
                    .filter(|a| a.name == name && a.state == "firing")
                    .collect::<Vec<_>>()
            };
            let revision = firing("NetwaveRevisionFailed");
            let applies: Vec<&str> = firing("NetwaveAgentApplyFailures")
                .iter()
                .map(|a| a.labels["instance"].as_str())
                .collect();
            (revision.len() == 1 && applies == [bad_agent.as_str()]).then_some(())
        },
    )
    .await;
    let fired_after = failed_at.elapsed();

    // No configurator left: the rule for it must see that at once (pending; it fires after its
    // `for: 2m`, which the promtool cases cover), and NetwaveNoLeader, which cannot, stays out of it.
    f.kill_leader().await.unwrap();
    assert_eq!(f.configurators_running(), 0);
    let killed_at = Instant::now();
    wait_alerts(&f, &prom, "NetwaveConfiguratorDown active", |alerts| {
        alerts
            .iter()
            .any(|a| a.name == "NetwaveConfiguratorDown")
            .then_some(())
    })
    .await;
    let down_after = killed_at.elapsed();
    let alerts = prom.alerts().await.unwrap();
    assert!(
        !alerts.iter().any(|a| a.name == "NetwaveNoLeader"),
        "{}",
        summary(&alerts)
    );
    eprintln!(
        "alerts e2e: fleet + prometheus up in {started:.1?}, samples rolled out and scraped at \
         {rolled_out:.1?}; failed revision -> alerts firing in {fired_after:.1?}; configurator killed -> \
         NetwaveConfiguratorDown pending in {down_after:.1?}; total {:.1?}",
        t0.elapsed()
    );
    drop(prom);
}
