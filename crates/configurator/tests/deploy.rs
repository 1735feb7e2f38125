//! `deploy/` must stay true to the code: every manifest is valid YAML, and every metric the alerts and
//! the dashboard query exists in the configurator's or the agent's registry.

use netwave_api::vocab::{NodePhase, NodeReason};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn deploy_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let mut out = Vec::new();
    for dir in [root.join("base"), root.join("monitoring")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            // Kustomizations are checked by rendering them (tests/install.rs).
            if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
                continue;
            }
            if p.extension().is_some_and(|x| x == "yaml" || x == "json") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Base names of the metrics a registry exposes (`# TYPE <name> <type>` lines).
fn exposed() -> BTreeSet<String> {
    use netwave_agent::shell::metrics as agent;
    use netwave_configurator::metrics as configurator;
    // Labelled families appear once a label set exists: create one of each.
    let c = configurator::Metrics::default();
    let _ = c
        .assignments
        .get_or_create(&configurator::ReasonLabels { reason: "Rollout" });
    let verb = configurator::Verb::patch;
    let _ = c.api_errors.get_or_create(&configurator::ApiErrorLabels {
        verb,
        category: "server",
    });
    let a = agent::Metrics::default();
    let _ = a.applies.get_or_create(&agent::ApplyLabels {
        phase: NodePhase::Invalid.as_str(),
        reason: NodeReason::ApplyFailed.as_str(),
    });
    let _ = a.probe_up.get_or_create(&agent::ProbeLabels {
        probe: "api".into(),
    });
    let _ = a.probe_duration.get_or_create(&agent::ProbeLabels {
        probe: "api".into(),
    });
    let text = c.encode() + &a.encode();
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// `netwave_*` names in a text, with sample suffixes stripped to the metric's base name.
fn referenced(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("netwave_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let base = ["_total", "_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name)
            .to_string();
        out.insert(base);
    }
    out
}

#[test]
fn manifests_parse() {
    let files = deploy_files();
    assert!(files.len() >= 4, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        if f.extension().is_some_and(|x| x == "json") {
            serde_json::from_str::<serde_json::Value>(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        } else {
            let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            for d in docs.iter().filter(|d| !d.is_null()) {
                assert!(
                    d["kind"].is_string() && d["metadata"]["name"].is_string(),
                    "{}: {d}",
                    f.display()
                );
            }
        }
    }
}

#[test]
fn alerts_and_dashboard_query_metrics_that_exist() {
    let exposed = exposed();
    let monitoring = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring");
    let mut checked = 0;
    for f in ["prometheusrule.yaml", "grafana-dashboard.json"] {
        let text = std::fs::read_to_string(monitoring.join(f)).unwrap();
        let names = referenced(&text);
        assert!(!names.is_empty(), "{f} queries no netwave metric");
        let missing: Vec<_> = names.iter().filter(|n| !exposed.contains(*n)).collect();
        assert!(
            missing.is_empty(),
            "{f} queries metrics nobody exposes: {missing:?}\nexposed: {exposed:?}"
        );
        checked += names.len();
    }
    assert!(checked >= 10);
}

/// Every object of `deploy/base`'s manifests (what `kubectl kustomize deploy/base` renders, but for the
/// image tags it sets).
fn base_objects() -> Vec<serde_json::Value> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base");
    let mut out = Vec::new();
    for f in deploy_files().into_iter().filter(|f| f.starts_with(&base)) {
        let text = std::fs::read_to_string(&f).unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        out.extend(docs.into_iter().filter(|d| !d.is_null()));
    }
    out
}

fn object<'a>(objects: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} in deploy/base"))
}

/// The pod template and its one container of a workload.
fn pod<'a>(
    objects: &'a [serde_json::Value],
    kind: &str,
    name: &str,
) -> (&'a serde_json::Value, &'a serde_json::Value) {
    let spec = &object(objects, kind, name)["spec"]["template"]["spec"];
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "{kind}/{name}: one container");
    (spec, &containers[0])
}

fn strings(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default()
}

/// A container's or else its pod's securityContext field.
fn security<'a>(
    pod: &'a serde_json::Value,
    c: &'a serde_json::Value,
    field: &str,
) -> &'a serde_json::Value {
    let own = &c["securityContext"][field];
    if own.is_null() {
        &pod["securityContext"][field]
    } else {
        own
    }
}

/// The agent runs as root (netlink) but with nothing else: only NET_ADMIN and NET_RAW, no privilege
/// escalation, the runtime's seccomp profile, a read-only root filesystem with its state directory
/// (the only place it writes) a hostPath.
#[test]
fn the_agent_runs_with_only_the_capabilities_it_needs_on_a_read_only_root() {
    let objects = base_objects();
    let (pod, c) = pod(&objects, "DaemonSet", "netwave-agent");
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{sc}");
    assert_ne!(sc["privileged"], true, "{sc}");
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{sc}");
    let added = strings(&sc["capabilities"]["add"]);
    assert!(
        added.iter().all(|a| ["NET_ADMIN", "NET_RAW"].contains(a)),
        "only NET_ADMIN and NET_RAW: {added:?}"
    );
    assert_eq!(security(pod, c, "seccompProfile")["type"], "RuntimeDefault");
    // Where it writes: its state directory (--state-dir, default /var/lib/netwave) on a hostPath.
    let state = strings(&c["args"])
        .iter()
        .find_map(|a| a.strip_prefix("--state-dir="))
        .unwrap_or("/var/lib/netwave")
        .to_string();
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == state.as_str())
        .unwrap_or_else(|| panic!("{state} is mounted"));
    assert_ne!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert!(volume["hostPath"].is_object(), "{volume}");
}

/// The configurator needs no privilege at all: a non-root user, no capabilities, a read-only root
/// filesystem, no privilege escalation, the runtime's seccomp profile.
#[test]
fn the_configurator_runs_as_non_root_on_a_read_only_root_without_capabilities() {
    let objects = base_objects();
    let (pod, c) = pod(&objects, "Deployment", "netwave-configurator");
    let sc = &c["securityContext"];
    assert_eq!(security(pod, c, "runAsNonRoot"), true);
    let user = security(pod, c, "runAsUser");
    assert!(user.as_u64().is_some_and(|u| u != 0), "runAsUser {user}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{sc}");
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{sc}");
    assert!(sc["capabilities"]["add"].is_null(), "{sc}");
    assert_eq!(security(pod, c, "seccompProfile")["type"], "RuntimeDefault");
}

/// On the host network 0.0.0.0 is every address of the node (the anycast gateways of the segments the
/// agent creates among them): /metrics listens on the node's own address, which the Service lists and
/// the ServiceMonitor scrapes; /healthz and /readyz on loopback, where the kubelet's probes go.
#[test]
fn the_host_network_agent_listens_on_the_node_address_and_loopback_only() {
    let objects = base_objects();
    let (pod, c) = pod(&objects, "DaemonSet", "netwave-agent");
    assert_eq!(pod["hostNetwork"], true);
    let args = strings(&c["args"]);
    let flag = |f: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{f}=")))
            .unwrap_or_else(|| panic!("--{f} is set: the default is 0.0.0.0"))
            .to_string()
    };
    let port = |name: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("a port named {name}"))["containerPort"]
            .as_u64()
            .unwrap()
    };
    let metrics = flag("metrics-addr");
    let (host, p) = metrics.rsplit_once(':').unwrap();
    let var = host
        .strip_prefix("$(")
        .and_then(|h| h.strip_suffix(')'))
        .unwrap_or_else(|| {
            panic!("--metrics-addr={metrics}: the node's address from the downward API")
        });
    let env = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == var)
        .unwrap_or_else(|| panic!("env {var}"));
    assert_eq!(env["valueFrom"]["fieldRef"]["fieldPath"], "status.hostIP");
    assert_eq!(p.parse::<u64>().unwrap(), port("metrics"));

    let health = flag("health-addr");
    let (host, p) = health.rsplit_once(':').unwrap();
    assert_eq!(host, "127.0.0.1", "--health-addr={health}");
    assert_eq!(p.parse::<u64>().unwrap(), port("health"));
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["host"], "127.0.0.1", "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "health", "{probe}");
    }

    // The scrape target: the agent's Service and ServiceMonitor use the port named metrics.
    let monitoring = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring");
    let text = std::fs::read_to_string(monitoring.join("servicemonitors.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let service = object(&docs, "Service", "netwave-agent-metrics");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    let monitor = object(&docs, "ServiceMonitor", "netwave-agent");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
}

/// The verbs a Role or ClusterRole grants on Events.
fn grants_events(role: &serde_json::Value) -> Vec<&str> {
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| strings(&r["resources"]).contains(&"events"))
        .flat_map(|r| strings(&r["verbs"]))
        .collect()
}

/// Events about cluster-scoped objects (every object either component reports on) live in `default`:
/// that is the one namespace either may create Events in, and with no verb beyond create and patch.
#[test]
fn events_are_granted_only_in_the_namespace_they_land_in() {
    let objects = base_objects();
    for role in objects.iter().filter(|o| o["kind"] == "ClusterRole") {
        assert!(
            grants_events(role).is_empty(),
            "{}: Events in every namespace",
            role["metadata"]["name"]
        );
    }
    for account in ["netwave-agent", "netwave-configurator"] {
        let binding = objects
            .iter()
            .find(|o| {
                o["kind"] == "RoleBinding"
                    && o["subjects"]
                        .as_array()
                        .is_some_and(|s| s.iter().any(|s| s["name"] == account))
                    && o["roleRef"]["kind"] == "Role"
                    && !grants_events(object(
                        &objects,
                        "Role",
                        o["roleRef"]["name"].as_str().unwrap(),
                    ))
                    .is_empty()
            })
            .unwrap_or_else(|| panic!("{account} may create Events somewhere"));
        assert_eq!(binding["metadata"]["namespace"], "default", "{binding}");
        let role = object(
            &objects,
            "Role",
            binding["roleRef"]["name"].as_str().unwrap(),
        );
        assert_eq!(role["metadata"]["namespace"], "default", "{role}");
        let mut verbs = grants_events(role);
        verbs.sort();
        assert_eq!(verbs, ["create", "patch"], "{role}");
    }
}

/// The admission policy lets the agent change only the taints it owns: every taint the shipped health
/// config tells the agent to remove must be one of them, or the agent could never remove it.
#[test]
fn the_agent_policy_owns_every_taint_the_health_config_removes() {
    let objects = base_objects();
    let health = object(&objects, "ConfigMap", "netwave-agent-health")["data"]["health.yaml"]
        .as_str()
        .unwrap();
    let health: serde_json::Value = serde_saphyr::from_str(health).unwrap();
    let removed = strings(&health["taints"]);
    assert!(!removed.is_empty());
    let policy = object(
        &objects,
        "ValidatingAdmissionPolicy",
        "netwave-agent-own-node",
    );
    let owned = policy["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "ownedTaints")
        .unwrap()["expression"]
        .as_str()
        .unwrap();
    let owned: Vec<String> = serde_json::from_str(owned).expect("a list literal");
    for t in removed {
        assert!(owned.iter().any(|o| o == t), "{t} is not in {owned:?}");
    }
}

/// The policies know the agent by what RBAC lets it do (write NodeNetworkConfig status, not their spec),
/// asked of the authorizer: no name spelled out (a kustomize `namespace:` or `namePrefix:` overlay would
/// leave it behind), no parameter whose absence lets everything through (#48). The agent's role has that
/// shape; the configurator's does not (it writes specs), so the policies never restrict it.
#[test]
fn the_agent_policies_know_the_agent_by_its_rbac_not_by_name_or_parameter() {
    let objects = base_objects();
    for name in ["netwave-agent-own-node", "netwave-agent-own-events"] {
        let policy = object(&objects, "ValidatingAdmissionPolicy", name);
        let text = policy.to_string();
        assert!(
            !text.contains("system:serviceaccount:") && !text.contains("params"),
            "a literal user or a parameter in {name}"
        );
        assert!(policy["spec"].get("paramKind").is_none(), "{name}");
        let condition = policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap();
        assert!(
            condition.contains(r#"subresource("status")"#) && condition.contains("authorizer"),
            "{name}: {condition}"
        );
        let binding = object(&objects, "ValidatingAdmissionPolicyBinding", name);
        assert!(binding["spec"].get("paramRef").is_none(), "{name}");
    }
    let agent = object(&objects, "ClusterRole", "netwave-agent");
    assert!(grants(agent, "nodenetworkconfigs/status").contains("patch"));
    let spec_writes = |role| {
        let g = grants(role, "nodenetworkconfigs");
        g.contains("patch") || g.contains("update")
    };
    assert!(!spec_writes(agent), "the agent's role matches the policies");
    let configurator = object(&objects, "ClusterRole", "netwave-configurator");
    assert!(spec_writes(configurator), "the configurator's does not");
}

/// The verbs `role` grants on `resource` in netwave's group.
fn grants<'a>(role: &'a serde_json::Value, resource: &str) -> BTreeSet<&'a str> {
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| strings(&r["apiGroups"]).contains(&netwave_api::GROUP))
        .filter(|r| strings(&r["resources"]).contains(&resource))
        .flat_map(|r| strings(&r["verbs"]))
        .collect()
}

/// The configurator watches every input kind and writes each one's status: a kind added to the list
/// (`netwave_api::kinds`) without its RBAC would leave the configurator blind to it (its watch refused),
/// and nothing could be cut while it cannot list.
#[test]
fn the_configurator_may_read_every_input_kind_and_write_its_status() {
    let objects = base_objects();
    let role = object(&objects, "ClusterRole", "netwave-configurator");
    for kind in netwave_api::InputKind::ALL {
        let plural = kind.api_resource().plural;
        let read = grants(role, &plural);
        for verb in ["get", "list", "watch"] {
            assert!(
                read.contains(verb),
                "{kind}: {verb} not granted on {plural}"
            );
        }
        let status = format!("{plural}/status");
        assert!(
            grants(role, &status).contains("patch"),
            "{kind}: patch not granted on {status}"
        );
        assert!(
            read.iter().all(|v| ["get", "list", "watch"].contains(v)),
            "{kind}: the configurator may only read inputs, not {read:?}"
        );
    }
}
