//! Conformance: drives the testbed with kube-rs exactly as netwave's binaries do and checks the
//! answers a real kube-apiserver gives. Waits are event-driven with timeouts, never sleeps.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use netwave_api::{NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec};
use netwave_testbed::{ClientIdentity, Match, Partition, Testbed, TestbedOptions};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

async fn testbed() -> Testbed {
    testbed_with(TestbedOptions::default()).await
}

async fn testbed_with(opts: TestbedOptions) -> Testbed {
    let crds: Vec<_> = netwave_api::crds().into_iter().map(|(_, c)| c).collect();
    Testbed::start(opts.with_crds(crds))
        .await
        .expect("testbed starts")
}

fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    c
}

fn nnc(name: &str, revision: &str) -> NodeNetworkConfig {
    NodeNetworkConfig::new(
        name,
        NodeNetworkConfigSpec {
            revision: revision.into(),
            sequence: 1,
            config_hash: "abc".into(),
            retry: 0,
            config: NodeConfig::default(),
        },
    )
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn next<S, T>(s: &mut S) -> T
where
    S: futures::Stream<Item = T> + Unpin,
{
    tokio::time::timeout(WAIT, s.next())
        .await
        .expect("event in time")
        .expect("stream open")
}

#[tokio::test]
async fn crud_resource_versions_and_stale_replace() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    let a = api
        .create(&PostParams::default(), &cm("a", &[("k", "1")]))
        .await
        .unwrap();
    let uid = a.metadata.uid.clone().unwrap();
    assert_eq!(uid.len(), 36);
    assert!(a.metadata.creation_timestamp.is_some());
    let rv1: u64 = a.resource_version().unwrap().parse().unwrap();
    let b = api
        .create(&PostParams::default(), &cm("b", &[]))
        .await
        .unwrap();
    let rv2: u64 = b.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv1, "resourceVersion is global and monotonic");

    let dup = api_err(
        api.create(&PostParams::default(), &cm("a", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));

    let mut fresh = api.get("a").await.unwrap();
    fresh.data = Some(BTreeMap::from([("k".into(), "2".into())]));
    let updated = api
        .replace("a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_eq!(updated.metadata.uid.as_deref(), Some(uid.as_str()));
    // `fresh` still carries the old resourceVersion: a stale replace is refused.
    let stale = api_err(
        api.replace("a", &PostParams::default(), &fresh)
            .await
            .unwrap_err(),
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    assert!(
        stale.message.contains("the object has been modified"),
        "{}",
        stale.message
    );

    api.delete("a", &DeleteParams::default()).await.unwrap();
    let gone = api_err(api.get("a").await.unwrap_err());
    assert_eq!((gone.code, gone.reason.as_str()), (404, "NotFound"));
    assert_eq!(gone.message, "configmaps \"a\" not found");

    let missing_ns: Api<ConfigMap> = Api::namespaced(tb.client(), "nope");
    let e = api_err(
        missing_ns
            .create(&PostParams::default(), &cm("x", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);
}

#[tokio::test]
async fn generation_follows_spec_and_status_is_isolated() {
    let tb = testbed().await;
    let api: Api<NodeNetworkConfig> = Api::all(tb.client());
    let mut obj = nnc("n1", "r1");
    obj.status = Some(Default::default());
    obj.status.as_mut().unwrap().phase = Some("Provisioned".into());
    let created = api.create(&PostParams::default(), &obj).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(
        created.status.is_none(),
        "status is dropped on create of a custom resource"
    );

    let pp = PatchParams::default();
    let labelled = api
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        labelled.metadata.generation,
        Some(1),
        "metadata changes keep generation"
    );

    let status = json!({"status": {"phase": "Provisioning", "observedRevision": "r1"}});
    let s = api
        .patch_status("n1", &pp, &Patch::Merge(status))
        .await
        .unwrap();
    assert_eq!(
        s.metadata.generation,
        Some(1),
        "status changes keep generation"
    );
    assert_eq!(
        s.status.as_ref().unwrap().phase.as_deref(),
        Some("Provisioning")
    );

    // Main endpoint ignores status, status endpoint ignores spec.
    let both = json!({"spec": {"revision": "r2"}, "status": {"phase": "Invalid"}});
    let m = api
        .patch("n1", &pp, &Patch::Merge(both.clone()))
        .await
        .unwrap();
    assert_eq!(m.spec.revision, "r2");
    assert_eq!(
        m.metadata.generation,
        Some(2),
        "spec change bumps generation"
    );
    assert_eq!(
        m.status.as_ref().unwrap().phase.as_deref(),
        Some("Provisioning")
    );
    let both = json!({"spec": {"revision": "r3"}, "status": {"phase": "Invalid"}});
    let s = api
        .patch_status("n1", &pp, &Patch::Merge(both))
        .await
        .unwrap();
    assert_eq!(s.spec.revision, "r2");
    assert_eq!(s.status.as_ref().unwrap().phase.as_deref(), Some("Invalid"));
    assert_eq!(s.metadata.generation, Some(2));

    // A no-op write keeps the resourceVersion.
    let again = api
        .patch_status(
            "n1",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Invalid"}})),
        )
        .await
        .unwrap();
    assert_eq!(again.resource_version(), s.resource_version());

    // Status through server-side apply.
    // The phase is owned by the merge patches' manager: taking it over needs force, as on a
    // real server.
    let ssa = PatchParams::apply("netwave-agent");
    let applied_conflict = json!({"apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig", "status": {"phase": "Provisioned"}});
    let e = api_err(
        api.patch_status("n1", &ssa, &Patch::Apply(applied_conflict))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    let ssa = ssa.force();
    let applied = json!({"apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig", "status": {"phase": "Provisioned"}});
    let s = api
        .patch_status("n1", &ssa, &Patch::Apply(applied))
        .await
        .unwrap();
    assert_eq!(s.status.unwrap().phase.as_deref(), Some("Provisioned"));
    let mf = s.metadata.managed_fields.unwrap();
    assert!(
        mf.iter()
            .any(|e| e.manager.as_deref() == Some("netwave-agent")
                && e.subresource.as_deref() == Some("status"))
    );
}

#[tokio::test]
async fn strategic_merge_is_415_on_custom_resources_and_merge_on_builtins() {
    let tb = testbed().await;
    let api: Api<NodeNetworkConfig> = Api::all(tb.client());
    api.create(&PostParams::default(), &nnc("n1", "r1"))
        .await
        .unwrap();
    let e = api_err(
        api.patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"revision": "x"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (415, "UnsupportedMediaType"));

    let cms: Api<ConfigMap> = Api::default_namespaced(tb.client());
    cms.create(&PostParams::default(), &cm("c", &[("a", "1"), ("b", "2")]))
        .await
        .unwrap();
    let p = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Strategic(json!({"data": {"a": null, "c": "3"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        p.data.unwrap(),
        BTreeMap::from([("b".into(), "2".into()), ("c".into(), "3".into())])
    );
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/data/b", "value": "9"}]))
            .unwrap();
    let p = cms
        .patch("c", &PatchParams::default(), &Patch::<()>::Json(jp))
        .await
        .unwrap();
    assert_eq!(p.data.unwrap()["b"], "9");
}

#[tokio::test]
async fn server_side_apply_removes_fields_and_reports_conflicts() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    let apply = |data: serde_json::Value| {
        Patch::Apply(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}, "data": data}),
        )
    };
    let a = PatchParams::apply("manager-a");
    api.patch("s", &a, &apply(json!({"x": "1", "y": "2"})))
        .await
        .unwrap();
    let after = api.patch("s", &a, &apply(json!({"x": "1"}))).await.unwrap();
    assert_eq!(
        after.data.unwrap(),
        BTreeMap::from([("x".into(), "1".into())]),
        "y was applied before and omitted now"
    );

    let b = PatchParams::apply("manager-b");
    let e = api_err(
        api.patch("s", &b, &apply(json!({"x": "2"})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("conflict with \"manager-a\""),
        "{}",
        e.message
    );
    let causes = e.details.unwrap().causes;
    assert_eq!(causes[0].field, ".data.x");

    // Same value: shared ownership, no conflict. Then a forced change moves ownership.
    api.patch("s", &b, &apply(json!({"x": "1"}))).await.unwrap();
    let forced = api
        .patch("s", &b.clone().force(), &apply(json!({"x": "3"})))
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["x"], "3");
    // manager-a lost x: its next apply without x does not remove it.
    let kept = api.patch("s", &a, &apply(json!({"z": "1"}))).await.unwrap();
    assert_eq!(kept.data.unwrap()["x"], "3");
    // Managers are (name, operation): a field set by manager-a's own merge patch (an Update)
    // conflicts with manager-a's apply, as on kube-apiserver.
    let upd = PatchParams {
        field_manager: Some("manager-a".into()),
        ..Default::default()
    };
    api.patch("s", &upd, &Patch::Merge(json!({"data": {"q": "1"}})))
        .await
        .unwrap();
    let e = api_err(
        api.patch("s", &a, &apply(json!({"z": "1", "q": "2"})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.details.unwrap().causes[0].field, ".data.q");
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    let mut c = cm("f", &[]);
    c.metadata.finalizers = Some(vec!["netwave.dev/cleanup".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    let mut events = api
        .watch(&WatchParams::default().fields("metadata.name=f"), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        next(&mut events).await.unwrap(),
        WatchEvent::Added(_)
    ));

    let res = api.delete("f", &DeleteParams::default()).await.unwrap();
    let pending = res
        .left()
        .expect("object returned while finalizers are pending");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert!(
        api.get("f")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    assert!(matches!(
        next(&mut events).await.unwrap(),
        WatchEvent::Modified(_)
    ));

    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(matches!(
        next(&mut events).await.unwrap(),
        WatchEvent::Deleted(_)
    ));
    assert_eq!(api_err(api.get("f").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn list_paging_and_selectors() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    for i in 0..7 {
        let mut c = cm(&format!("c{i}"), &[]);
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        c.metadata.labels = Some(BTreeMap::from([
            ("tier".into(), tier.into()),
            (format!("only{i}"), "x".into()),
        ]));
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        names.extend(page.items.iter().map(|c| c.name_any()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, (0..7).map(|i| format!("c{i}")).collect::<Vec<_>>());
    let count = |sel: &'static str| {
        let api = api.clone();
        async move {
            api.list(&ListParams::default().labels(sel))
                .await
                .unwrap()
                .items
                .len()
        }
    };
    assert_eq!(count("tier=even").await, 4);
    assert_eq!(count("tier==odd").await, 3);
    assert_eq!(count("tier!=odd").await, 4);
    assert_eq!(count("tier in (odd,even)").await, 7);
    assert_eq!(count("tier notin (odd)").await, 4);
    assert_eq!(count("only3").await, 1);
    assert_eq!(count("!only3").await, 6);
    let one = api
        .list(&ListParams::default().fields("metadata.name=c4"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    let nnc: Api<NodeNetworkConfig> = Api::all(tb.client());
    let e = api_err(
        nnc.list(&ListParams::default().fields("spec.revision=x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
}

#[tokio::test]
async fn watch_selector_transitions() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    let mut c = cm("t", &[]);
    c.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
    let created = api.create(&PostParams::default(), &c).await.unwrap();
    let wp = WatchParams::default().labels("app=web");
    let mut events = api
        .watch(&wp, &created.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    let relabel = |v: &'static str| Patch::Merge(json!({"metadata": {"labels": {"app": v}}}));
    api.patch("t", &PatchParams::default(), &relabel("db"))
        .await
        .unwrap();
    match next(&mut events).await.unwrap() {
        WatchEvent::Deleted(o) => assert_eq!(o.name_any(), "t"),
        other => panic!("expected DELETED when the object stops matching, got {other:?}"),
    }
    api.patch("t", &PatchParams::default(), &relabel("web"))
        .await
        .unwrap();
    assert!(
        matches!(next(&mut events).await.unwrap(), WatchEvent::Added(_)),
        "ADDED when it matches again"
    );
}

#[tokio::test]
async fn watch_from_compacted_version_is_410() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    let c = api
        .create(&PostParams::default(), &cm("old", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("newer", &[]))
        .await
        .unwrap();
    tb.compact();
    let mut events = api
        .watch(&WatchParams::default(), &c.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    match next(&mut events).await.unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
    // A resourceVersion from the future (a restarted server) also sends clients back to relisting.
    let mut events = api
        .watch(&WatchParams::default(), "999999")
        .await
        .unwrap()
        .boxed();
    match next(&mut events).await.unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn bookmarks_and_timeouts() {
    let tb = testbed_with(TestbedOptions {
        bookmark_interval: Duration::from_millis(50),
        ..Default::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    let c = api
        .create(&PostParams::default(), &cm("b", &[]))
        .await
        .unwrap();
    let wp = WatchParams::default().timeout(1);
    let mut events = api
        .watch(&wp, &c.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    match next(&mut events).await.unwrap() {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.metadata.resource_version, c.resource_version().unwrap())
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
    // The server closes the stream after timeoutSeconds.
    let end = tokio::time::timeout(WAIT, async { while events.next().await.is_some() {} }).await;
    assert!(end.is_ok());
}

/// Collects watcher events until `done` says so.
async fn watch_until<K, S>(stream: &mut S, mut done: impl FnMut(&watcher::Event<K>) -> bool)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(WAIT, async {
        while let Some(ev) = stream.next().await {
            if let Ok(ev) = ev
                && done(&ev)
            {
                return;
            }
        }
        panic!("watcher stream ended");
    })
    .await
    .expect("watcher event in time");
}

fn applied_named<K: ResourceExt>(name: &'static str) -> impl FnMut(&watcher::Event<K>) -> bool {
    move |ev| matches!(ev, watcher::Event::Apply(o) | watcher::Event::InitApply(o) if o.name_any() == name)
}

#[tokio::test]
async fn watcher_recovers_from_dropped_stream_without_relisting() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    api.create(&PostParams::default(), &cm("one", &[]))
        .await
        .unwrap();
    let mut w = watcher(api.clone(), watcher::Config::default()).boxed();
    watch_until(&mut w, |e| matches!(e, watcher::Event::InitDone)).await;
    // An event through the watch proves the watch request is open before the faults.
    api.create(&PostParams::default(), &cm("warm", &[]))
        .await
        .unwrap();
    watch_until(&mut w, applied_named("warm")).await;
    let lists = tb.counters().get("list", "configmaps");
    tb.faults().cut_watches();
    api.create(&PostParams::default(), &cm("two", &[]))
        .await
        .unwrap();
    watch_until(&mut w, applied_named("two")).await;
    assert_eq!(
        tb.counters().get("list", "configmaps"),
        lists,
        "resumed from its resourceVersion"
    );
    assert!(tb.counters().get("watch", "configmaps") >= 2);
}

#[tokio::test]
async fn watcher_recovers_from_410_by_relisting() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    api.create(&PostParams::default(), &cm("one", &[]))
        .await
        .unwrap();
    let mut w = watcher(api.clone(), watcher::Config::default()).boxed();
    watch_until(&mut w, |e| matches!(e, watcher::Event::InitDone)).await;
    // An event through the watch proves the watch request is open before the faults.
    api.create(&PostParams::default(), &cm("warm", &[]))
        .await
        .unwrap();
    watch_until(&mut w, applied_named("warm")).await;
    let lists = tb.counters().get("list", "configmaps");
    // Writes the watcher misses, then history loss and a cut: resuming must fail with 410.
    tb.faults().cut_watches();
    api.create(&PostParams::default(), &cm("missed", &[]))
        .await
        .unwrap();
    tb.compact();
    watch_until(&mut w, applied_named("missed")).await;
    assert!(
        tb.counters().get("list", "configmaps") > lists,
        "relisted after 410"
    );
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_end() {
    let tb = testbed().await;
    let api: Api<NodeNetworkConfig> = Api::all(tb.client());
    for i in 0..3 {
        api.create(&PostParams::default(), &nnc(&format!("n{i}"), "r1"))
            .await
            .unwrap();
    }
    let mut w = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    watch_until(&mut w, |e| {
        if let watcher::Event::InitApply(o) = e {
            initial.push(o.name_any());
        }
        matches!(e, watcher::Event::InitDone)
    })
    .await;
    assert_eq!(initial, vec!["n0", "n1", "n2"]);
    assert_eq!(
        tb.counters().get("list", "nodenetworkconfigs"),
        0,
        "no list call in streaming mode"
    );
    api.create(&PostParams::default(), &nnc("n3", "r1"))
        .await
        .unwrap();
    watch_until(&mut w, applied_named("n3")).await;
}

#[tokio::test]
async fn single_object_watcher_by_field_selector() {
    let tb = testbed().await;
    let api: Api<NodeNetworkConfig> = Api::all(tb.client());
    api.create(&PostParams::default(), &nnc("mine", "r1"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &nnc("other", "r1"))
        .await
        .unwrap();
    let mut w = watcher(
        api.clone(),
        watcher::Config::default().fields("metadata.name=mine"),
    )
    .boxed();
    let mut seen = Vec::new();
    watch_until(&mut w, |e| {
        if let watcher::Event::InitApply(o) = e {
            seen.push(o.name_any());
        }
        matches!(e, watcher::Event::InitDone)
    })
    .await;
    assert_eq!(seen, vec!["mine"]);
    api.patch(
        "other",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"revision": "r2"}})),
    )
    .await
    .unwrap();
    api.patch(
        "mine",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"revision": "r2"}})),
    )
    .await
    .unwrap();
    let ev = tokio::time::timeout(WAIT, w.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        watcher::Event::Apply(o) => assert_eq!(
            (o.name_any(), o.spec.revision),
            ("mine".to_string(), "r2".to_string())
        ),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn schema_is_enforced_with_field_paths_and_unknown_fields_pruned() {
    let tb = testbed().await;
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        tb.client(),
        &kube::api::ApiResource::erase::<NodeNetworkConfig>(&()),
    );
    let mut bad: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig", "metadata": {"name": "bad"},
        "spec": {"revision": "r", "sequence": -1, "configHash": "h", "config": {}}
    }))
    .unwrap();
    let e = api_err(api.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message
            .starts_with("NodeNetworkConfig.netwave.dev \"bad\" is invalid: spec.sequence"),
        "{}",
        e.message
    );
    assert_eq!(e.details.unwrap().causes[0].field, "spec.sequence");

    bad.data["spec"]["sequence"] = json!(1);
    bad.data["spec"]
        .as_object_mut()
        .unwrap()
        .remove("configHash");
    let e = api_err(api.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(e.details.unwrap().causes[0].field, "spec.configHash");
    assert!(
        e.message.ends_with("spec.configHash: Required value"),
        "{}",
        e.message
    );

    bad.data["spec"]["configHash"] = json!("h");
    bad.data["spec"]["surplus"] = json!(true);
    let created = api.create(&PostParams::default(), &bad).await.unwrap();
    assert!(
        created.data["spec"].get("surplus").is_none(),
        "unknown fields are pruned"
    );
    assert_eq!(
        created.data["spec"]["config"]["vrfs"],
        json!([]),
        "defaults are applied"
    );
}

#[tokio::test]
async fn injected_faults_partitions_and_counters() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    // (kube retries 429/503 by itself; 500 reaches the caller.)
    tb.faults()
        .fail_next(Match::verb("create").resource("configmaps"), 1, 500);
    let e = api_err(
        api.create(&PostParams::default(), &cm("x", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    api.create(&PostParams::default(), &cm("x", &[]))
        .await
        .unwrap();
    let counts = tb.counters();
    assert_eq!(counts.get("create", "configmaps"), 2);

    tb.faults()
        .delay(Match::verb("get"), Duration::from_millis(200));
    let t0 = std::time::Instant::now();
    api.get("x").await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(200));
    tb.faults().clear();

    let cut_off = Api::<ConfigMap>::default_namespaced(tb.client_as(ClientIdentity {
        token: Some("agent-n1".into()),
        ..Default::default()
    }));
    let healthy = Api::<ConfigMap>::default_namespaced(tb.client_as(ClientIdentity {
        token: Some("agent-n2".into()),
        ..Default::default()
    }));
    tb.faults().partition(Partition::Token("agent-n1".into()));
    assert!(cut_off.get("x").await.is_err());
    healthy.get("x").await.unwrap();
    tb.faults().heal();
    cut_off.get("x").await.unwrap();
}

/// The bytes and watch events the server sends are counted per client (its bearer token), exactly as
/// the client receives them: a benchmark takes each client's share of the server's traffic from them.
#[tokio::test]
async fn what_the_server_sends_is_counted_per_client_in_bytes_and_watch_events() {
    use futures::AsyncBufReadExt;
    let tb = testbed().await;
    let as_token = |t: &str| {
        tb.client_as(ClientIdentity {
            token: Some(t.into()),
            ..Default::default()
        })
    };
    let (watcher_client, writer) = (as_token("watcher"), as_token("writer"));
    // The watcher follows configmap x only; y's events are not its.
    let req = http::Request::get(
        "/api/v1/namespaces/default/configmaps?watch=true&fieldSelector=metadata.name%3Dx",
    )
    .body(Vec::new())
    .unwrap();
    let mut lines = watcher_client.request_stream(req).await.unwrap();
    let mut sent: BTreeMap<String, u64> = BTreeMap::new();
    for (verb, method, path, body) in [
        (
            "create",
            "POST",
            "/api/v1/namespaces/default/configmaps",
            json!(cm("x", &[("a", "1")])),
        ),
        (
            "create",
            "POST",
            "/api/v1/namespaces/default/configmaps",
            json!(cm("y", &[])),
        ),
        (
            "get",
            "GET",
            "/api/v1/namespaces/default/configmaps/x",
            json!(null),
        ),
        (
            "update",
            "PUT",
            "/api/v1/namespaces/default/configmaps/x",
            json!(cm("x", &[("a", "2")])),
        ),
    ] {
        let body = if body.is_null() {
            Vec::new()
        } else {
            serde_json::to_vec(&body).unwrap()
        };
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        *sent.entry(verb.to_string()).or_default() +=
            writer.request_text(req).await.unwrap().len() as u64;
    }
    // Two events reach the watcher: x added, x modified.
    let mut received = 0u64;
    for _ in 0..2 {
        let mut line = String::new();
        lines.read_line(&mut line).await.unwrap();
        assert!(line.contains("\"name\":\"x\""), "{line}");
        received += line.len() as u64;
    }
    let traffic = tb.traffic();
    let (w, r) = (&traffic["watcher"], &traffic["writer"]);
    assert_eq!(
        w.watch_events,
        BTreeMap::from([("configmaps".to_string(), 2)])
    );
    assert_eq!(
        w.watch_event_bytes,
        BTreeMap::from([("configmaps".to_string(), received)])
    );
    assert!(
        w.response_bytes.is_empty(),
        "a watch's bytes are its events'"
    );
    assert_eq!(r.response_bytes, sent);
    assert!(r.watch_events.is_empty());
    tb.reset_counters();
    assert!(tb.traffic().is_empty());
}

#[tokio::test]
async fn garbage_collection_of_dependents_is_switchable() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    let owner = api
        .create(&PostParams::default(), &cm("owner", &[]))
        .await
        .unwrap();
    let owned = |name: &str| {
        let mut c = cm(name, &[]);
        c.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: owner.metadata.uid.clone().unwrap(),
                ..Default::default()
            },
        ]);
        c
    };
    api.create(&PostParams::default(), &owned("dep"))
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        api_err(api.get("dep").await.unwrap_err()).code,
        404,
        "dependent collected"
    );

    tb.set_garbage_collection(false);
    let owner = api
        .create(&PostParams::default(), &cm("owner", &[]))
        .await
        .unwrap();
    let mut c = owned("dep2");
    c.metadata.owner_references.as_mut().unwrap()[0].uid = owner.metadata.uid.unwrap();
    api.create(&PostParams::default(), &c).await.unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    api.get("dep2").await.unwrap();
}

#[tokio::test]
async fn crd_lifecycle_serves_and_stops_serving() {
    let tb = Testbed::start(TestbedOptions::default()).await.unwrap();
    let client = tb.client();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    let nnc_api: Api<NodeNetworkConfig> = Api::all(client.clone());
    assert_eq!(
        api_err(nnc_api.list(&ListParams::default()).await.unwrap_err()).code,
        404
    );
    let crd = netwave_api::crds()
        .into_iter()
        .find(|(f, _)| f.starts_with("nodenetwork"))
        .unwrap()
        .1;
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let established = crds.get("nodenetworkconfigs.netwave.dev").await.unwrap();
    let conds = established.status.unwrap().conditions.unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    nnc_api
        .create(&PostParams::default(), &nnc("a", "r"))
        .await
        .unwrap();
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.groups().any(|g| g.name() == "netwave.dev"));
    crds.delete("nodenetworkconfigs.netwave.dev", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        api_err(nnc_api.list(&ListParams::default()).await.unwrap_err()).code,
        404
    );
}

#[tokio::test]
async fn nodes_and_leases_are_served() {
    let tb = testbed().await;
    let nodes: Api<Node> = Api::all(tb.client());
    let mut n = Node::default();
    n.metadata.name = Some("node-1".into());
    nodes.create(&PostParams::default(), &n).await.unwrap();
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let leases: Api<Lease> = Api::namespaced(tb.client(), "kube-node-lease");
    let mut l = Lease::default();
    l.metadata.name = Some("node-1".into());
    leases.create(&PostParams::default(), &l).await.unwrap();
    // Unconditional update is allowed on built-ins (no resourceVersion in the body).
    let mut l2 = leases.get("node-1").await.unwrap();
    l2.metadata.resource_version = None;
    l2.spec = Some(Default::default());
    l2.spec.as_mut().unwrap().holder_identity = Some("node-1".into());
    leases
        .replace("node-1", &PostParams::default(), &l2)
        .await
        .unwrap();
}

#[tokio::test]
async fn table_output_uses_printer_columns() {
    let tb = testbed().await;
    let api: Api<NodeNetworkConfig> = Api::all(tb.client());
    api.create(&PostParams::default(), &nnc("n1", "rev-7"))
        .await
        .unwrap();
    let client: Client = tb.client();
    let req = http::Request::get("/apis/netwave.dev/v1alpha1/nodenetworkconfigs")
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .unwrap();
    let table: serde_json::Value = client.request(req).await.unwrap();
    assert_eq!(table["kind"], "Table");
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "Name");
    let rev = names
        .iter()
        .position(|n| *n == "Revision")
        .expect("Revision column from the CRD");
    assert_eq!(table["rows"][0]["cells"][0], "n1");
    assert_eq!(table["rows"][0]["cells"][rev], "rev-7");
}

#[tokio::test]
async fn write_options_and_edge_cases() {
    let tb = testbed().await;
    let api: Api<NodeNetworkConfig> = Api::all(tb.client());
    // dryRun stores nothing.
    let dry = api
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &nnc("dry", "r"),
        )
        .await
        .unwrap();
    assert_eq!(dry.metadata.name.as_deref(), Some("dry"));
    assert_eq!(api_err(api.get("dry").await.unwrap_err()).code, 404);

    // generateName.
    let mut g = nnc("", "r");
    g.metadata.name = None;
    g.metadata.generate_name = Some("node-".into());
    let made = api.create(&PostParams::default(), &g).await.unwrap();
    assert!(
        made.name_any().starts_with("node-") && made.name_any().len() == 10,
        "{}",
        made.name_any()
    );

    // A custom resource cannot be replaced without a resourceVersion.
    let mut unconditional = api.get(&made.name_any()).await.unwrap();
    unconditional.metadata.resource_version = None;
    let e = api_err(
        api.replace(&made.name_any(), &PostParams::default(), &unconditional)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(
        e.details.unwrap().causes[0].field,
        "metadata.resourceVersion"
    );

    // A failing JSON patch test operation changes nothing.
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/spec/revision", "value": "nope"}, {"op": "replace", "path": "/spec/revision", "value": "x"}])).unwrap();
    let e = api_err(
        api.patch(
            &made.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(jp),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(api.get(&made.name_any()).await.unwrap().spec.revision, "r");

    // fieldValidation=Strict refuses unknown fields instead of pruning them.
    let raw = json!({"apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig", "metadata": {"name": "strict"},
        "spec": {"revision": "r", "sequence": 1, "configHash": "h", "config": {}, "bogus": 1}});
    let req =
        http::Request::post("/apis/netwave.dev/v1alpha1/nodenetworkconfigs?fieldValidation=Strict")
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&raw).unwrap())
            .unwrap();
    let e = api_err(
        tb.client()
            .request::<NodeNetworkConfig>(req)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    assert!(
        e.message.contains("unknown field \"spec.bogus\""),
        "{}",
        e.message
    );

    // deletecollection with a label selector.
    let cms: Api<ConfigMap> = Api::default_namespaced(tb.client());
    for (name, team) in [("a", "x"), ("b", "x"), ("c", "y")] {
        let mut c = cm(name, &[]);
        c.metadata.labels = Some(BTreeMap::from([("team".into(), team.into())]));
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("team=x"),
    )
    .await
    .unwrap();
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(left, vec!["c"]);

    // Delete preconditions.
    let c = cms.get("c").await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("other".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert_eq!(api_err(cms.delete("c", &dp).await.unwrap_err()).code, 409);
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: c.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    cms.delete("c", &dp).await.unwrap();
}

#[tokio::test]
async fn node_conditions_merge_by_type_under_server_side_apply() {
    let tb = testbed().await;
    let nodes: Api<Node> = Api::all(tb.client());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    // What netwave-agent does: apply its own condition, forced, on the status subresource.
    let cond = |status: &str| {
        Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
            "status": {"conditions": [{"type": "NetworkReady", "status": status, "reason": "Provisioned"}]}}))
    };
    let pp = PatchParams::apply("netwave-agent").force();
    let n = nodes.patch_status("n1", &pp, &cond("True")).await.unwrap();
    let conds = |n: &Node| -> Vec<(String, String)> {
        n.status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect()
    };
    assert_eq!(
        conds(&n),
        vec![
            ("Ready".into(), "True".into()),
            ("NetworkReady".into(), "True".into())
        ]
    );
    let n = nodes.patch_status("n1", &pp, &cond("False")).await.unwrap();
    assert_eq!(
        conds(&n),
        vec![
            ("Ready".into(), "True".into()),
            ("NetworkReady".into(), "False".into())
        ]
    );
    // A strategic merge patch (kubelet-style) merges conditions by type too.
    let smp =
        Patch::Strategic(json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}));
    let n = nodes
        .patch_status("n1", &PatchParams::default(), &smp)
        .await
        .unwrap();
    assert_eq!(
        conds(&n),
        vec![
            ("Ready".into(), "False".into()),
            ("NetworkReady".into(), "False".into())
        ]
    );
}

#[tokio::test]
async fn metadata_views_namespaces_and_expired_continue() {
    let tb = testbed().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(tb.client());
    for n in ["m1", "m2"] {
        let mut c = cm(n, &[("big", "payload")]);
        c.metadata.labels = Some(BTreeMap::from([("k".into(), "v".into())]));
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
    // PartialObjectMetadata for get, list and watch (kube's metadata_watcher).
    let meta = cms.get_metadata("m1").await.unwrap();
    assert_eq!(meta.metadata.labels.unwrap()["k"], "v");
    let list = cms.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    let mut w = watcher(
        Api::<kube::core::PartialObjectMeta<ConfigMap>>::default_namespaced(tb.client()),
        watcher::Config::default(),
    )
    .boxed();
    let mut seen = 0;
    watch_until(&mut w, |e| {
        if matches!(e, watcher::Event::InitApply(_)) {
            seen += 1;
        }
        matches!(e, watcher::Event::InitDone)
    })
    .await;
    assert_eq!(seen, 2);

    // A continue token from before a compaction is 410 Gone.
    let page = cms.list(&ListParams::default().limit(1)).await.unwrap();
    let token = page.metadata.continue_.unwrap();
    cms.create(&PostParams::default(), &cm("m3", &[]))
        .await
        .unwrap();
    tb.compact();
    let e = api_err(
        cms.list(&ListParams::default().limit(1).continue_token(&token))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));

    // Deleting a namespace deletes what is in it.
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(tb.client());
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let team: Api<ConfigMap> = Api::namespaced(tb.client(), "team-a");
    team.create(&PostParams::default(), &cm("x", &[]))
        .await
        .unwrap();
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        3,
        "namespaces are separate"
    );
    nss.delete("team-a", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_err(team.get("x").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn label_syntax_is_validated() {
    let tb = testbed().await;
    let api: Api<ConfigMap> = Api::default_namespaced(tb.client());
    let mut ok = cm("ok", &[]);
    ok.metadata.labels = Some(BTreeMap::from([
        ("netwave.dev/pool".into(), "rack-1_a.b".into()),
        ("empty".into(), "".into()),
    ]));
    api.create(&PostParams::default(), &ok).await.unwrap();
    let mut bad = cm("bad", &[]);
    bad.metadata.labels = Some(BTreeMap::from([(
        "netwave.dev/pool".into(),
        "10.0.0.0/24".into(),
    )]));
    let e = api_err(api.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!(e.code, 422);
    assert_eq!(
        e.details.unwrap().causes[0].field,
        "metadata.labels.netwave.dev/pool"
    );
    bad.metadata.labels = Some(BTreeMap::from([("-bad".into(), "x".into())]));
    assert_eq!(
        api_err(api.create(&PostParams::default(), &bad).await.unwrap_err()).code,
        422
    );
}
