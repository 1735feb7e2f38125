//! The real `kubectl` against the testbed: apply netwave's CRDs and samples, get (printer columns
//! via Table output), describe, re-apply an edit (client-side apply patch), delete.
//!
//! Uses the `kubectl` on PATH; where there is none, tries to install Debian's `kubernetes-client`
//! (as root), and skips with a message only if neither works.

use std::path::{Path, PathBuf};

use kube::api::DynamicObject;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Resource};
use netwave_testbed::{Testbed, TestbedOptions};
use tokio::process::Command;

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.is_file())
}

async fn find_kubectl() -> Option<PathBuf> {
    if let Some(k) = on_path("kubectl") {
        return Some(k);
    }
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .is_some_and(|o| o.stdout.starts_with(b"0"));
    if root && on_path("apt-get").is_some() {
        let _ = Command::new("apt-get")
            .args(["install", "-y", "-q", "kubernetes-client"])
            .output()
            .await;
    }
    on_path("kubectl")
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    async fn run(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .await
            .expect("kubectl runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{text}");
        text
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[tokio::test]
async fn kubectl_applies_gets_describes_and_deletes_netwave_resources() {
    let Some(bin) = find_kubectl().await else {
        eprintln!("SKIPPED: no kubectl on PATH and kubernetes-client could not be installed");
        return;
    };
    let tb = Testbed::start(TestbedOptions::default()).await.unwrap();
    let k = Kubectl {
        bin,
        kubeconfig: tb.kubeconfig_path().to_path_buf(),
    };
    let crds = repo().join("crds");
    let samples = repo().join("deploy/samples");

    let out = k.ok(&["apply", "-k", crds.to_str().unwrap()]).await;
    assert!(
        out.contains(
            "customresourcedefinition.apiextensions.k8s.io/nodenetworkconfigs.netwave.dev created"
        ),
        "{out}"
    );
    let out = k.ok(&["apply", "-f", samples.to_str().unwrap()]).await;
    assert!(
        out.contains("vrfrouteconfiguration.netwave.dev/cluster created"),
        "{out}"
    );
    // Moving the same manifests to server-side apply: equal values (schema defaults included)
    // are shared with the client-side-apply manager, not conflicts.
    let out = k
        .ok(&["apply", "--server-side", "-f", samples.to_str().unwrap()])
        .await;
    assert!(
        out.contains("routingtable.netwave.dev/oob serverside-applied"),
        "{out}"
    );

    // Printer columns from the CRD, through the server's Table output.
    let out = k.ok(&["get", "vrf"]).await;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "VRF", "VNI", "TABLE", "ACCEPTED", "NODES", "AGE"],
        "{out}"
    );
    let cluster = out
        .lines()
        .find(|l| l.starts_with("cluster "))
        .expect("cluster row");
    assert!(cluster.contains("2001000"), "{out}");
    let out = k.ok(&["get", "crds"]).await;
    assert!(out.contains("vrfrouteconfigurations.netwave.dev"), "{out}");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(tb.client());
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-1", "labels": {"node-role.kubernetes.io/worker": ""}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.33.0"}},
    }))
    .unwrap();
    nodes
        .create(&kube::api::PostParams::default(), &node)
        .await
        .unwrap();
    let out = k.ok(&["get", "nodes"]).await;
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        (row[0], row[1], row[2], row[4]),
        ("node-1", "Ready", "worker", "v1.33.0"),
        "{out}"
    );
    let out = k.ok(&["get", "nnc"]).await;
    assert!(out.contains("No resources found"), "{out}");

    // An event recorded by a controller (events.k8s.io/v1) shows up in describe (core/v1).
    let vrfs: Api<netwave_api::VRFRouteConfiguration> = Api::all(tb.client());
    let vrf = vrfs.get("cluster").await.unwrap();
    let recorder = Recorder::new(
        tb.client(),
        Reporter {
            controller: "netwave-configurator".into(),
            instance: None,
        },
    );
    let ev = Event {
        type_: EventType::Normal,
        reason: "RevisionCreated".into(),
        note: Some("folded into revision 1".into()),
        action: "Fold".into(),
        secondary: None,
    };
    recorder.publish(&ev, &vrf.object_ref(&())).await.unwrap();
    let out = k.ok(&["describe", "vrf", "cluster"]).await;
    assert!(
        out.contains("Name:") && out.contains("cluster") && out.contains("Route Target:"),
        "{out}"
    );
    assert!(
        out.contains("RevisionCreated") && out.contains("folded into revision 1"),
        "{out}"
    );

    // Re-applying an edited manifest patches the live object.
    let edited = std::fs::read_to_string(samples.join("vrfs.yaml"))
        .unwrap()
        .replace("vni: 2001000", "vni: 2001999");
    let dir = tb.kubeconfig_path().parent().unwrap().join("edited");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("vrfs.yaml"), edited).unwrap();
    let out = k
        .ok(&["apply", "-f", dir.join("vrfs.yaml").to_str().unwrap()])
        .await;
    assert!(
        out.contains("vrfrouteconfiguration.netwave.dev/cluster configured"),
        "{out}"
    );
    assert!(
        out.contains("vrfrouteconfiguration.netwave.dev/storage unchanged"),
        "{out}"
    );
    let api: Api<DynamicObject> = Api::all_with(
        tb.client(),
        &kube::api::ApiResource::erase::<netwave_api::VRFRouteConfiguration>(&()),
    );
    assert_eq!(
        api.get("cluster").await.unwrap().data["spec"]["vni"],
        2001999
    );

    // Schema errors come back with their field path.
    let bad = std::fs::read_to_string(samples.join("vrfs.yaml"))
        .unwrap()
        .replace("mtu: 9000", "mtu: 99999");
    std::fs::write(dir.join("bad.yaml"), bad).unwrap();
    let (ok, out) = k
        .run(&["apply", "-f", dir.join("bad.yaml").to_str().unwrap()])
        .await;
    assert!(!ok && out.contains("spec.mtu"), "{out}");

    // kubectl get -w: Table rows over a watch.
    let mut watch = Command::new(&k.bin)
        .arg("--kubeconfig")
        .arg(&k.kubeconfig)
        .args(["get", "vrf", "-w"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().unwrap()));
    let wait = std::time::Duration::from_secs(20);
    let mut next_line = async || {
        tokio::time::timeout(wait, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    assert!(next_line().await.starts_with("NAME"));
    for _ in 0..4 {
        next_line().await;
    }
    api.patch(
        "storage",
        &Default::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"vni": 2002999}})),
    )
    .await
    .unwrap();
    let row = next_line().await;
    assert!(
        row.starts_with("storage") && row.contains("2002999"),
        "{row}"
    );
    let _ = watch.start_kill();

    let out = k.ok(&["delete", "vrf", "cluster"]).await;
    assert!(out.contains("\"cluster\" deleted"), "{out}");
    let (ok, out) = k.run(&["get", "vrf", "cluster"]).await;
    assert!(!ok && out.contains("NotFound"), "{out}");
    assert!(api.get("cluster").await.is_err());
}
