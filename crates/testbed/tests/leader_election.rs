//! Leader election with kube-lease-manager (the crate the configurator uses) against the testbed:
//! two processes contend for one Lease. kube-lease-manager takes the Lease with server-side apply
//! *without* force and relies on the server's 409 field-ownership conflict, so this proves the
//! testbed's SSA conflict semantics are strong enough for mutual exclusion.
//!
//! The contenders are this test binary re-executed with `LEASE_CONTENDER` set (running only the
//! ignored `contender` test); each prints `leader=<bool>` on every change, and releases the Lease
//! and exits when its stdin closes.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseParams};
use netwave_testbed::{Testbed, TestbedOptions};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const LEASE: &str = "netwave-configurator";
const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
#[ignore = "child process of two_processes_contend_for_one_lease"]
async fn contender() {
    let (Ok(id), Ok(url)) = (
        std::env::var("LEASE_CONTENDER"),
        std::env::var("TESTBED_URL"),
    ) else {
        return;
    };
    let mut cfg = kube::Config::new(url.parse().unwrap());
    cfg.default_namespace = "default".into();
    let client = kube::Client::try_from(cfg).unwrap();
    let params = LeaseParams::new(id.clone(), 2, 1);
    let manager = LeaseManager::new(
        client,
        LEASE,
        "default",
        params,
        LeaseCreateMode::AutoCreate,
    )
    .await
    .unwrap();
    let (mut rx, handle) = manager.watch().await;
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 16];
    loop {
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() { break }
                println!("leader={}", *rx.borrow_and_update());
            }
            n = stdin.read(&mut buf) => if n.map_or(true, |n| n == 0) { break },
        }
    }
    drop(rx);
    let _ = handle.await;
    println!("released");
}

struct Contender {
    child: Child,
}

/// A report line from a contender.
#[derive(Debug)]
struct Report {
    who: &'static str,
    line: String,
}

fn spawn(who: &'static str, url: &str, reports: mpsc::UnboundedSender<Report>) -> Contender {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "contender",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LEASE_CONTENDER", who)
        .env("TESTBED_URL", url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    tokio::spawn(async move {
        let mut lines = BufReader::new(out).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            // libtest prints `test contender ... ` without a newline before the first report.
            for key in ["leader=true", "leader=false", "released"] {
                if line.contains(key) {
                    let _ = reports.send(Report {
                        who,
                        line: key.to_string(),
                    });
                }
            }
        }
    });
    Contender { child }
}

/// Beliefs of each contender, checked for mutual exclusion after every report.
#[derive(Default)]
struct Beliefs(BTreeMap<&'static str, bool>);

impl Beliefs {
    fn record(&mut self, r: &Report) {
        if let Some(v) = r.line.strip_prefix("leader=") {
            self.0.insert(r.who, v == "true");
        }
        let leaders: Vec<_> = self
            .0
            .iter()
            .filter(|(_, l)| **l)
            .map(|(w, _)| *w)
            .collect();
        assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
    }

    fn end(&mut self, who: &'static str) {
        self.0.insert(who, false);
    }

    fn leader(&self) -> Option<&'static str> {
        self.0.iter().find(|(_, l)| **l).map(|(w, _)| *w)
    }
}

async fn until_leader(
    rx: &mut mpsc::UnboundedReceiver<Report>,
    beliefs: &mut Beliefs,
    not: Option<&str>,
) -> &'static str {
    tokio::time::timeout(WAIT, async {
        loop {
            let r = rx.recv().await.expect("contenders report");
            beliefs.record(&r);
            if let Some(l) = beliefs.leader()
                && Some(l) != not
            {
                return l;
            }
        }
    })
    .await
    .expect("a leader is elected in time")
}

async fn holder(tb: &Testbed) -> Option<String> {
    let leases: Api<Lease> = Api::default_namespaced(tb.client());
    leases
        .get(LEASE)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn two_processes_contend_for_one_lease() {
    let tb = Testbed::start(TestbedOptions::default()).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut procs = BTreeMap::new();
    procs.insert("a", spawn("a", &tb.url(), tx.clone()));
    procs.insert("b", spawn("b", &tb.url(), tx.clone()));
    let mut beliefs = Beliefs::default();

    let first = until_leader(&mut rx, &mut beliefs, None).await;
    assert_eq!(holder(&tb).await.as_deref(), Some(first));
    assert!(tb.counters().get("patch", "leases") >= 1);

    // The leader crashes: it stops renewing, and the other takes over after expiry.
    let mut crashed = procs.remove(first).unwrap();
    crashed.child.start_kill().unwrap();
    let _ = crashed.child.wait().await;
    beliefs.end(first);
    let second = until_leader(&mut rx, &mut beliefs, Some(first)).await;
    assert_ne!(second, first);
    assert_eq!(holder(&tb).await.as_deref(), Some(second));

    // A third contender joins; the leader then steps down and releases, and the newcomer takes over.
    procs.insert("c", spawn("c", &tb.url(), tx.clone()));
    let mut stepping_down = procs.remove(second).unwrap();
    beliefs.end(second);
    drop(stepping_down.child.stdin.take());
    let third = until_leader(&mut rx, &mut beliefs, Some(second)).await;
    assert_eq!(third, "c");
    let status = tokio::time::timeout(WAIT, stepping_down.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    assert_eq!(holder(&tb).await.as_deref(), Some("c"));
    for (_, mut p) in procs {
        let _ = p.child.start_kill();
        let _ = p.child.wait().await;
    }
}

/// The exact write kube-lease-manager makes to take an orphaned Lease: only one of two racing
/// contenders may succeed, the other must get the 409 it maps to `LockConflict`, also after the
/// holder's renewals (strategic merge patches), and a force release (fields set to null) must let
/// the next contender apply without conflict.
#[tokio::test]
async fn orphan_lock_is_decided_by_field_ownership_conflict() {
    use kube::api::{Patch, PatchParams, PostParams};
    let tb = Testbed::start(TestbedOptions::default()).await.unwrap();
    let leases: Api<Lease> = Api::default_namespaced(tb.client());
    let mut l = Lease::default();
    l.metadata.name = Some(LEASE.into());
    leases.create(&PostParams::default(), &l).await.unwrap();
    let lock = |who: &str| {
        Patch::Apply(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "spec": {"acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": "2026-01-01T00:00:00.000000Z",
                     "holderIdentity": who, "leaseDurationSeconds": 2},
        }))
    };
    let pp = |who: &str| PatchParams {
        field_manager: Some(format!("kube-lease-manager-{who}")),
        ..Default::default()
    };
    leases.patch(LEASE, &pp("a"), &lock("a")).await.unwrap();
    let e = match leases.patch(LEASE, &pp("b"), &lock("b")).await.unwrap_err() {
        kube::Error::Api(s) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    let renew = Patch::Strategic(
        serde_json::json!({"spec": {"renewTime": "2026-01-01T00:00:01.000000Z", "leaseDurationSeconds": 2}}),
    );
    leases.patch(LEASE, &pp("a"), &renew).await.unwrap();
    // After a renewal the lease is still a's: b's apply still conflicts.
    assert!(
        matches!(leases.patch(LEASE, &pp("b"), &lock("b")).await, Err(kube::Error::Api(s)) if s.code == 409)
    );
    let release = Patch::Strategic(
        serde_json::json!({"spec": {"acquireTime": null, "renewTime": null, "holderIdentity": null, "leaseDurationSeconds": null}}),
    );
    leases.patch(LEASE, &pp("b"), &release).await.unwrap();
    leases.patch(LEASE, &pp("b"), &lock("b")).await.unwrap();
    assert_eq!(holder(&tb).await.as_deref(), Some("b"));
}
