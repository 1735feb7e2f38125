//! kube-runtime on the testbed: a `Controller` with owned children and status writes, the
//! reflector store, the event `Recorder`; plus the `netwave-testbed` binary and the admin endpoint.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use netwave_api::{NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec};
use netwave_testbed::{Testbed, TestbedOptions};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(15);

fn nnc(name: &str) -> NodeNetworkConfig {
    NodeNetworkConfig::new(
        name,
        NodeNetworkConfigSpec {
            revision: "r1".into(),
            sequence: 1,
            config_hash: "h".into(),
            retry: 0,
            config: NodeConfig::default(),
        },
    )
}

async fn testbed() -> Testbed {
    let crds: Vec<_> = netwave_api::crds().into_iter().map(|(_, c)| c).collect();
    Testbed::start(TestbedOptions::default().with_crds(crds))
        .await
        .unwrap()
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct ReconcileError(#[from] kube::Error);

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
}

/// Creates an owned ConfigMap per NodeNetworkConfig and reports `Provisioned` in its status.
async fn reconcile(obj: Arc<NodeNetworkConfig>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let cms: Api<ConfigMap> = Api::default_namespaced(ctx.client.clone());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(format!("nnc-{}", obj.name_any()));
    cm.metadata.owner_references = Some(vec![obj.controller_owner_ref(&()).unwrap()]);
    cm.data = Some([("revision".to_string(), obj.spec.revision.clone())].into());
    cms.patch(
        &cm.name_any(),
        &PatchParams::apply("test-controller").force(),
        &Patch::Apply(&cm),
    )
    .await?;
    let api: Api<NodeNetworkConfig> = Api::all(ctx.client.clone());
    let status = json!({"apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig",
        "status": {"phase": "Provisioned", "observedRevision": obj.spec.revision}});
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply("test-controller").force(),
        &Patch::Apply(status),
    )
    .await?;
    ctx.recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "Reconciled".into(),
                note: None,
                action: "Reconcile".into(),
                secondary: None,
            },
            &obj.object_ref(&()),
        )
        .await?;
    Ok(Action::await_change())
}

#[tokio::test]
async fn controller_reconciles_owned_children_and_status() {
    let tb = testbed().await;
    let client = tb.client();
    let api: Api<NodeNetworkConfig> = Api::all(client.clone());
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "test-controller".into(),
            instance: None,
        },
    );
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        recorder,
    });
    let controller = Controller::new(api.clone(), watcher::Config::default())
        .owns(cms.clone(), watcher::Config::default())
        .run(
            reconcile,
            |_, _: &ReconcileError, _| Action::requeue(Duration::from_secs(1)),
            ctx,
        )
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);

    api.create(&PostParams::default(), &nnc("n1"))
        .await
        .unwrap();
    let mut w = watcher(
        api.clone(),
        watcher::Config::default().fields("metadata.name=n1"),
    )
    .applied_objects()
    .boxed();
    tokio::time::timeout(WAIT, async {
        while let Some(Ok(o)) = w.next().await {
            if o.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Provisioned") {
                return;
            }
        }
    })
    .await
    .expect("status written by the controller");
    assert_eq!(
        cms.get("nnc-n1").await.unwrap().data.unwrap()["revision"],
        "r1"
    );

    // A spec change re-triggers the reconciler, which updates the child.
    api.patch(
        "n1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"revision": "r2"}})),
    )
    .await
    .unwrap();
    let mut cw = watcher(
        cms.clone(),
        watcher::Config::default().fields("metadata.name=nnc-n1"),
    )
    .applied_objects()
    .boxed();
    tokio::time::timeout(WAIT, async {
        while let Some(Ok(c)) = cw.next().await {
            if c.data.as_ref().is_some_and(|d| d["revision"] == "r2") {
                return;
            }
        }
    })
    .await
    .expect("child updated after a spec change");

    let events: Api<K8sEvent> = Api::default_namespaced(client.clone());
    let evs = events.list(&ListParams::default()).await.unwrap();
    assert!(
        evs.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Reconciled"))
    );
    // The same events through core/v1, as kubectl describe reads them.
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(client.clone());
    let found = core
        .list(
            &ListParams::default()
                .fields("involvedObject.name=n1,involvedObject.kind=NodeNetworkConfig"),
        )
        .await
        .unwrap();
    let e = found
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("Reconciled"))
        .expect("core/v1 view of the event");
    assert_eq!(e.reporting_component.as_deref(), Some("test-controller"));

    // Deleting the owner collects the child (garbage collection).
    let mut dw = watcher(
        cms.clone(),
        watcher::Config::default().fields("metadata.name=nnc-n1"),
    )
    .boxed();
    wait_for(&mut dw, |e| matches!(e, watcher::Event::InitDone)).await;
    api.delete("n1", &DeleteParams::default()).await.unwrap();
    wait_for(
        &mut dw,
        |e| matches!(e, watcher::Event::Delete(c) if c.name_any() == "nnc-n1"),
    )
    .await;
    assert!(cms.get_opt("nnc-n1").await.unwrap().is_none());
    handle.abort();
}

async fn wait_for<S>(s: &mut S, pred: fn(&watcher::Event<ConfigMap>) -> bool)
where
    S: futures::Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(WAIT, async {
        while let Some(ev) = s.next().await {
            if ev.as_ref().is_ok_and(pred) {
                return;
            }
        }
    })
    .await
    .expect("watch event in time")
}

#[tokio::test]
async fn reflector_store_follows_the_server() {
    let tb = testbed().await;
    let api: Api<NodeNetworkConfig> = Api::all(tb.client());
    for i in 0..5 {
        api.create(&PostParams::default(), &nnc(&format!("n{i}")))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store();
    let mut stream = reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().page_size(2)),
    )
    .boxed();
    let names = |r: &reflector::Store<NodeNetworkConfig>| {
        let mut n: Vec<String> = r.state().iter().map(|o| o.name_any()).collect();
        n.sort();
        n
    };
    // Drive the reflector event by event, checking the store after each.
    let mut until = async |want: &[&str]| {
        tokio::time::timeout(WAIT, async {
            while names(&reader) != want {
                stream.next().await.expect("reflector stream open").ok();
            }
        })
        .await
        .unwrap_or_else(|_| panic!("store converges to {want:?}, has {:?}", names(&reader)))
    };
    until(&["n0", "n1", "n2", "n3", "n4"]).await;
    api.delete("n0", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &nnc("n9"))
        .await
        .unwrap();
    until(&["n1", "n2", "n3", "n4", "n9"]).await;
    assert!(
        tb.counters().get("list", "nodenetworkconfigs") >= 3,
        "paged initial list (page size 2)"
    );
}

#[tokio::test]
async fn binary_serves_with_crds_and_prints_its_address() {
    let dir = std::env::temp_dir().join(format!("netwave-testbed-bin-{}", std::process::id()));
    let kubeconfig = dir.join("kubeconfig");
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_netwave-testbed"))
        .args(["--port", "0", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--crds")
        .arg(&crds)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stdout.take().unwrap()));
    let url = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    assert_eq!(cfg.cluster_url.to_string().trim_end_matches('/'), url);
    let client = kube::Client::try_from(cfg).unwrap();
    let api: Api<NodeNetworkConfig> = Api::all(client);
    api.create(&PostParams::default(), &nnc("x")).await.unwrap();
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    child.start_kill().unwrap();
    let _ = child.wait().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn admin_endpoint_injects_faults_and_reports_counters() {
    let tb = testbed().await;
    let client = tb.client();
    let admin = |method: &str, path: &str, body: serde_json::Value| {
        http::Request::builder()
            .method(method)
            .uri(path)
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap()
    };
    let rule = json!({"match": {"verb": "list", "resource": "nodenetworkconfigs"}, "action": {"fail": 500}, "budget": {"next": 1}});
    let _: serde_json::Value = client
        .request(admin("POST", "/testbed/faults", rule))
        .await
        .unwrap();
    let api: Api<NodeNetworkConfig> = Api::all(client.clone());
    assert!(api.list(&ListParams::default()).await.is_err());
    api.list(&ListParams::default()).await.unwrap();
    let counters: serde_json::Value = client
        .request(admin("GET", "/testbed/counters", json!(null)))
        .await
        .unwrap();
    assert_eq!(counters["list nodenetworkconfigs"], 2);
    let _: serde_json::Value = client
        .request(admin(
            "POST",
            "/testbed/partition",
            json!({"userAgent": "doomed"}),
        ))
        .await
        .unwrap();
    let doomed = tb.client_as(netwave_testbed::ClientIdentity {
        user_agent: Some("doomed/1.0".into()),
        token: None,
    });
    assert!(
        Api::<NodeNetworkConfig>::all(doomed)
            .list(&ListParams::default())
            .await
            .is_err()
    );
    let _: serde_json::Value = client
        .request(admin("DELETE", "/testbed/partition", json!(null)))
        .await
        .unwrap();
}
