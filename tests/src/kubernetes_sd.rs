//! Prometheus's Kubernetes service discovery, role `endpoints`, for a Prometheus built without it.
//!
//! Debian's prometheus leaves out `kubernetes_sd_configs` (client-go is not packaged in Debian), and no
//! other Prometheus can be installed here. So this does what that discovery does, under Prometheus's own
//! ServiceAccount token, and hands the targets over as a `file_sd` file (Prometheus rereads it on every
//! change):
//!
//! ```text
//!   API server ──list Endpoints, Services, Pods (Prometheus's token)──► target_groups() ──► <file>.json
//!     every `every` (Prometheus watches; a 1 s poll is as good for a test)       (written atomically)
//! ```
//!
//! Each target carries the meta labels Prometheus 2.42's endpoints discovery gives it
//! (`discovery/kubernetes/endpoints.go`): the namespace, the Endpoints object (name, labels) and the
//! Service (name, labels, annotations), per address and port the endpoint's port name, protocol, readiness and target,
//! and for a Pod target the pod's and the matching container's labels; a pod's container ports that no
//! endpoint port names are targets too, without endpoint labels. The scrape jobs' relabelings (rendered
//! from the ServiceMonitors: [`crate::prometheus::service_monitor_jobs`]) then select exactly as they
//! would with Prometheus's own discovery.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// The discovery loop; stops when dropped.
pub struct EndpointsDiscovery {
    task: tokio::task::JoinHandle<()>,
    refusals: Arc<Mutex<Vec<(f64, String)>>>,
}

impl EndpointsDiscovery {
    /// Discovers the endpoints of `namespaces` (`None`: all) with `client` (Prometheus's identity) every
    /// `every`, writing the target groups to `file`.
    pub fn start(
        client: Client,
        namespaces: Option<Vec<String>>,
        file: PathBuf,
        every: Duration,
    ) -> EndpointsDiscovery {
        let refusals = Arc::new(Mutex::new(Vec::new()));
        let refused = refusals.clone();
        let task = tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut last = None;
            let mut last_error = String::new();
            let mut ticks = tokio::time::interval(every);
            loop {
                ticks.tick().await;
                match discover(&client, namespaces.as_deref()).await {
                    Ok(groups) => {
                        let text = serde_json::to_string_pretty(&groups).unwrap_or_default();
                        if last.as_ref() != Some(&text) {
                            if let Err(e) = write_atomically(&file, &text) {
                                eprintln!("endpoints discovery: {e:#}");
                            }
                            let ready: Vec<&str> = groups
                                .iter()
                                .filter(|g| {
                                    g["labels"]["__meta_kubernetes_endpoint_ready"] == "true"
                                })
                                .filter_map(|g| g["targets"][0].as_str())
                                .collect();
                            eprintln!(
                                "endpoints discovery (+{:.1} s): {} targets, ready endpoints {ready:?}",
                                started.elapsed().as_secs_f64(),
                                groups.len()
                            );
                            last = Some(text);
                        }
                        last_error.clear();
                    }
                    // A refusal is what a test must see; an API server that does not answer is retried
                    // (Prometheus keeps the last targets meanwhile, as this keeps the file).
                    Err(e) if is_refusal(&e) => {
                        let at = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0.0, |d| d.as_secs_f64());
                        refused.lock().unwrap().push((at, format!("{e:#}")));
                    }
                    Err(e) => {
                        let text = format!("{e:#}");
                        if text != last_error {
                            eprintln!(
                                "endpoints discovery (+{:.1} s, retrying): {text}",
                                started.elapsed().as_secs_f64()
                            );
                            last_error = text;
                        }
                    }
                }
            }
        });
        EndpointsDiscovery { task, refusals }
    }

    /// The API server's refusals so far (401, 403: the ClusterRole lacks something) with when they
    /// came (unix seconds), one line each.
    pub fn refusals(&self) -> Vec<(f64, String)> {
        self.refusals.lock().unwrap().clone()
    }
}

fn is_refusal(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(c.downcast_ref::<kube::Error>(), Some(kube::Error::Api(ae)) if ae.code == 401 || ae.code == 403)
    })
}

impl Drop for EndpointsDiscovery {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn write_atomically(file: &std::path::Path, text: &str) -> Result<()> {
    let tmp = file.with_extension("json.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, file).with_context(|| format!("renaming to {}", file.display()))
}

async fn discover(client: &Client, namespaces: Option<&[String]>) -> Result<Vec<Value>> {
    let scopes: Vec<Option<&str>> = match namespaces {
        None => vec![None],
        Some(ns) => ns.iter().map(|n| Some(n.as_str())).collect(),
    };
    let lp = ListParams::default();
    let (mut endpoints, mut services, mut pods) = (Vec::new(), Vec::new(), Vec::new());
    for scope in scopes {
        let (e, s, p): (Api<Endpoints>, Api<Service>, Api<Pod>) = match scope {
            None => (
                Api::all(client.clone()),
                Api::all(client.clone()),
                Api::all(client.clone()),
            ),
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
        };
        let what = scope.unwrap_or("all namespaces");
        endpoints.extend(
            e.list(&lp)
                .await
                .with_context(|| format!("listing Endpoints in {what}"))?
                .items,
        );
        services.extend(
            s.list(&lp)
                .await
                .with_context(|| format!("listing Services in {what}"))?
                .items,
        );
        pods.extend(
            p.list(&lp)
                .await
                .with_context(|| format!("listing Pods in {what}"))?
                .items,
        );
    }
    Ok(target_groups(&endpoints, &services, &pods))
}

/// A label name as Prometheus sanitises it for a meta label.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `<prefix>_label_<k>`, `<prefix>_labelpresent_<k>` (and the same for annotations) of an object.
fn object_labels(
    out: &mut BTreeMap<String, String>,
    prefix: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) {
    for (kind, map) in [("label", labels), ("annotation", annotations)] {
        for (k, v) in map {
            let k = sanitize(k);
            out.insert(format!("{prefix}_{kind}_{k}"), v.clone());
            out.insert(format!("{prefix}_{kind}present_{k}"), "true".into());
        }
    }
}

fn pod_labels(pod: &Pod) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let p = "__meta_kubernetes_pod";
    let status = pod.status.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    out.insert(format!("{p}_name"), pod.name_any());
    out.insert(format!("{p}_ip"), status.pod_ip.clone().unwrap_or_default());
    object_labels(&mut out, p, pod.labels(), pod.annotations());
    if let Some(owner) = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    {
        out.insert(format!("{p}_controller_kind"), owner.kind.clone());
        out.insert(format!("{p}_controller_name"), owner.name.clone());
    }
    out.insert(
        format!("{p}_node_name"),
        spec.node_name.clone().unwrap_or_default(),
    );
    out.insert(
        format!("{p}_host_ip"),
        status.host_ip.clone().unwrap_or_default(),
    );
    out.insert(format!("{p}_uid"), pod.uid().unwrap_or_default());
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map_or("unknown".to_string(), |c| c.status.to_lowercase());
    out.insert(format!("{p}_ready"), ready);
    out.insert(
        format!("{p}_phase"),
        status.phase.clone().unwrap_or_default(),
    );
    out
}

/// The targets of `endpoints` (with their Services and Pods) as file_sd target groups, one per target.
pub fn target_groups(endpoints: &[Endpoints], services: &[Service], pods: &[Pod]) -> Vec<Value> {
    let mut groups = Vec::new();
    for ep in endpoints {
        let ns = ep.namespace().unwrap_or_default();
        let mut base = BTreeMap::new();
        base.insert("__meta_kubernetes_namespace".to_string(), ns.clone());
        base.insert(
            "__meta_kubernetes_endpoints_name".to_string(),
            ep.name_any(),
        );
        // (The Endpoints object's labels only, not its annotations.)
        object_labels(
            &mut base,
            "__meta_kubernetes_endpoints",
            ep.labels(),
            &BTreeMap::new(),
        );
        if let Some(svc) = services.iter().find(|s| {
            s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == ep.name_any()
        }) {
            base.insert("__meta_kubernetes_service_name".into(), svc.name_any());
            object_labels(
                &mut base,
                "__meta_kubernetes_service",
                svc.labels(),
                svc.annotations(),
            );
        }
        let find_pod = |name: &str| {
            pods.iter()
                .find(|p| p.namespace().as_deref() == Some(ns.as_str()) && p.name_any() == name)
        };
        // (pod, container port) already a target through an endpoint port.
        let mut seen: BTreeSet<(String, i32)> = BTreeSet::new();
        let mut seen_pods: Vec<&Pod> = Vec::new();
        for subset in ep.subsets.iter().flatten() {
            let addresses = subset
                .addresses
                .iter()
                .flatten()
                .map(|a| (a, "true"))
                .chain(
                    subset
                        .not_ready_addresses
                        .iter()
                        .flatten()
                        .map(|a| (a, "false")),
                );
            for (addr, ready) in addresses {
                for port in subset.ports.iter().flatten() {
                    let mut labels = base.clone();
                    let e = "__meta_kubernetes_endpoint";
                    labels.insert(
                        format!("{e}_port_name"),
                        port.name.clone().unwrap_or_default(),
                    );
                    labels.insert(
                        format!("{e}_port_protocol"),
                        port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    );
                    labels.insert(format!("{e}_ready"), ready.into());
                    if let Some(h) = &addr.hostname {
                        labels.insert(format!("{e}_hostname"), h.clone());
                    }
                    if let Some(n) = &addr.node_name {
                        labels.insert(format!("{e}_node_name"), n.clone());
                    }
                    if let Some(t) = &addr.target_ref {
                        labels.insert(
                            format!("{e}_address_target_kind"),
                            t.kind.clone().unwrap_or_default(),
                        );
                        labels.insert(
                            format!("{e}_address_target_name"),
                            t.name.clone().unwrap_or_default(),
                        );
                        if t.kind.as_deref() == Some("Pod")
                            && let Some(pod) = t.name.as_deref().and_then(find_pod)
                        {
                            labels.extend(pod_labels(pod));
                            if !seen_pods.iter().any(|p| p.uid() == pod.uid()) {
                                seen_pods.push(pod);
                            }
                            let spec = pod.spec.clone().unwrap_or_default();
                            for c in &spec.containers {
                                for cp in c.ports.iter().flatten() {
                                    if cp.container_port == port.port {
                                        labels.extend(container_labels(c, cp));
                                        seen.insert((pod.name_any(), cp.container_port));
                                    }
                                }
                            }
                        }
                    }
                    groups.push(json!({
                        "targets": [format!("{}:{}", addr.ip, port.port)],
                        "labels": labels,
                    }));
                }
            }
        }
        // A pod's container ports that no endpoint port covers are targets too.
        for pod in seen_pods {
            let spec = pod.spec.clone().unwrap_or_default();
            let ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_default();
            for c in &spec.containers {
                for cp in c.ports.iter().flatten() {
                    if seen.contains(&(pod.name_any(), cp.container_port)) {
                        continue;
                    }
                    let mut labels = base.clone();
                    labels.extend(pod_labels(pod));
                    labels.extend(container_labels(c, cp));
                    groups.push(json!({
                        "targets": [format!("{ip}:{}", cp.container_port)],
                        "labels": labels,
                    }));
                }
            }
        }
    }
    groups
}

fn container_labels(
    c: &k8s_openapi::api::core::v1::Container,
    port: &k8s_openapi::api::core::v1::ContainerPort,
) -> BTreeMap<String, String> {
    let p = "__meta_kubernetes_pod_container";
    BTreeMap::from([
        (format!("{p}_name"), c.name.clone()),
        (
            format!("{p}_port_name"),
            port.name.clone().unwrap_or_default(),
        ),
        (format!("{p}_port_number"), port.container_port.to_string()),
        (
            format!("{p}_port_protocol"),
            port.protocol.clone().unwrap_or_else(|| "TCP".into()),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj<T: k8s_openapi::serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    /// The shipped configurator Service's endpoints: one ready pod with a metrics and a health port.
    #[test]
    fn endpoints_become_targets_with_the_meta_labels_of_prometheus_endpoints_discovery() {
        let ep: Endpoints = obj(json!({
            "metadata": {"name": "netwave-configurator-metrics", "namespace": "netwave-system"},
            "subsets": [{
                "addresses": [{"ip": "10.244.0.5", "nodeName": "node-real",
                               "targetRef": {"kind": "Pod", "name": "c-1", "namespace": "netwave-system"}}],
                "notReadyAddresses": [{"ip": "10.244.0.6",
                               "targetRef": {"kind": "Pod", "name": "c-2", "namespace": "netwave-system"}}],
                "ports": [{"name": "metrics", "port": 9090, "protocol": "TCP"}],
            }],
        }));
        let svc: Service = obj(json!({
            "metadata": {"name": "netwave-configurator-metrics", "namespace": "netwave-system",
                         "labels": {"app.kubernetes.io/name": "netwave-configurator"}},
        }));
        let pod = |name: &str, ip: &str| -> Pod {
            obj(json!({
                "metadata": {"name": name, "namespace": "netwave-system", "uid": name},
                "spec": {"nodeName": "node-real", "containers": [{"name": "configurator",
                         "ports": [{"name": "metrics", "containerPort": 9090}, {"name": "health", "containerPort": 8081}]}]},
                "status": {"podIP": ip, "phase": "Running"},
            }))
        };
        let groups = target_groups(
            &[ep],
            &[svc],
            &[pod("c-1", "10.244.0.5"), pod("c-2", "10.244.0.6")],
        );
        let targets: Vec<(&str, &str, &str)> = groups
            .iter()
            .map(|g| {
                (
                    g["targets"][0].as_str().unwrap(),
                    g["labels"]["__meta_kubernetes_endpoint_port_name"]
                        .as_str()
                        .unwrap_or("-"),
                    g["labels"]["__meta_kubernetes_endpoint_ready"]
                        .as_str()
                        .unwrap_or("-"),
                )
            })
            .collect();
        assert_eq!(
            targets,
            [
                ("10.244.0.5:9090", "metrics", "true"),
                ("10.244.0.6:9090", "metrics", "false"),
                ("10.244.0.5:8081", "-", "-"),
                ("10.244.0.6:8081", "-", "-"),
            ]
        );
        let l = &groups[0]["labels"];
        assert_eq!(
            l["__meta_kubernetes_service_label_app_kubernetes_io_name"],
            "netwave-configurator"
        );
        assert_eq!(
            l["__meta_kubernetes_service_labelpresent_app_kubernetes_io_name"],
            "true"
        );
        assert_eq!(l["__meta_kubernetes_endpoint_address_target_kind"], "Pod");
        assert_eq!(l["__meta_kubernetes_pod_name"], "c-1");
        assert_eq!(l["__meta_kubernetes_pod_node_name"], "node-real");
        assert_eq!(l["__meta_kubernetes_pod_container_name"], "configurator");
        assert_eq!(l["__meta_kubernetes_pod_container_port_name"], "metrics");
    }
}
