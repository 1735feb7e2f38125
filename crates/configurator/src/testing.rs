//! Test support (the `testing` feature, which only dev-dependencies enable): the arguments of a
//! configurator that a test runs, in one place for this crate's tests, the plugin's and the e2e fleet's.

use crate::args::Args;

/// A leader's lease lost within seconds, so failover tests end in seconds.
pub const LEASE_TIMINGS: [&str; 6] = [
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "300ms",
];

/// Resyncs and input settling fast.
pub const LOOP_TIMINGS: [&str; 4] = ["--resync-interval", "2s", "--input-settle", "300ms"];

/// Metrics and health on ports the kernel picks, text logs: many configurators on one host.
pub const LOCAL_ENDPOINTS: [&str; 6] = [
    "--metrics-addr",
    "127.0.0.1:0",
    "--health-addr",
    "127.0.0.1:0",
    "--log-format",
    "text",
];

/// netwave's CRDs with the `maximum` of some fields taken out (each a `pointer` into the schema of the
/// CRD committed as `file`): the schemas before those bounds existed, under which a test stores objects
/// the Rust types cannot decode (DESIGN.md §6, "One bad object never blinds the fleet").
pub fn crds_without_bound(
    fields: &[(&str, &str)],
) -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    netwave_api::crds()
        .into_iter()
        .map(|(f, crd)| {
            let mut v = serde_json::to_value(crd).expect("a CRD is JSON");
            for (_, pointer) in fields.iter().filter(|(file, _)| *file == f) {
                let schema = &mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
                let field = schema
                    .pointer_mut(pointer)
                    .expect("the field is in the schema");
                let bound = field.as_object_mut().and_then(|o| o.remove("maximum"));
                assert!(bound.is_some(), "{f}: {pointer} has no maximum");
            }
            serde_json::from_value(v).expect("still a CRD")
        })
        .collect()
}

/// The arguments of an in-process configurator in a test: [`LEASE_TIMINGS`], [`LOOP_TIMINGS`],
/// [`LOCAL_ENDPOINTS`], then `extra` (a later value of an option replaces an earlier one). Checked as
/// the binary checks them.
pub fn args(extra: &[&str]) -> Args {
    use clap::Parser;
    let mut argv = vec!["netwave-configurator"];
    argv.extend_from_slice(&LEASE_TIMINGS);
    argv.extend_from_slice(&LOOP_TIMINGS);
    argv.extend_from_slice(&LOCAL_ENDPOINTS);
    argv.extend_from_slice(extra);
    let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    if let Err(e) = args.check() {
        panic!("{argv:?}: {e}");
    }
    args
}

/// A fleet without an API server: [`crate::decide::compute`]'s intents applied to a [`Snapshot`] as
/// the watches would deliver them (the reconcile benchmark, and tests that drive a rollout in
/// simulated time). Agents' answers are the caller's (`netwave_agent::sim`).
pub mod inmem {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;
    use netwave_api::vocab::{ConditionStatus, node_conditions};
    use netwave_api::{
        ASSIGNED_AT_ANNOTATION, NetworkConfigInputs, NetworkConfigRevision, NodeNetworkConfig,
        NodeNetworkConfigSpec, QUEUED_ANNOTATION,
    };
    use netwave_core::Timestamp;

    use crate::snapshot::Snapshot;
    use crate::writer::Intent;

    /// The configurator's own defaults, as its command line gives them, without the input settle
    /// window (simulated time moves by reconciles: the window would only add idle ones).
    pub fn settings() -> crate::decide::Settings {
        let mut settings =
            crate::runtime::settings(&<crate::args::Args as clap::Parser>::parse_from([
                "netwave-configurator",
            ]));
        settings.input_settle = std::time::Duration::ZERO;
        settings
    }

    /// A snapshot holding the sample inputs and the Ready worker
    /// nodes `nodes`.
    pub fn samples_snapshot(nodes: impl IntoIterator<Item = String>) -> Snapshot {
        use netwave_api::manifest::{Manifest, samples};
        let mut s = Snapshot::default();
        for m in samples().expect("the samples parse") {
            if let Manifest::Input(o) = m {
                s.inputs.push(o);
            }
        }
        s.nodes = nodes.into_iter().map(|n| node(&n)).collect();
        s
    }

    /// A Ready worker Node named `name`.
    pub fn node(name: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                labels: Some(
                    [
                        ("kubernetes.io/hostname".to_string(), name.to_string()),
                        ("node-role.kubernetes.io/worker".to_string(), String::new()),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: node_conditions::READY.into(),
                    status: ConditionStatus::True.as_str().into(),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        })
    }

    /// `now` as an API time.
    pub fn time(now: Timestamp) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_millisecond(now.0).expect("a valid time"))
    }

    /// The snapshot as the watches would hold it after `intents` were written at `now`.
    pub fn apply(s: &mut Snapshot, intents: Vec<Intent>, now: Timestamp) {
        fn upsert<K: kube::Resource>(list: &mut Vec<Arc<K>>, o: K) {
            let name = o.meta().name.clone();
            match list.iter_mut().find(|x| x.meta().name == name) {
                Some(slot) => *slot = Arc::new(o),
                None => list.push(Arc::new(o)),
            }
        }
        let mut generation = 0;
        for intent in intents {
            generation += 1;
            match intent {
                Intent::CreateRevision {
                    name, spec, inputs, ..
                } => {
                    let mut r = NetworkConfigRevision::new(&name, *spec);
                    r.metadata.uid = Some(format!("uid-{name}"));
                    r.metadata.generation = Some(1);
                    r.metadata.creation_timestamp = Some(time(now));
                    upsert(&mut s.revisions, r);
                    let mut i = NetworkConfigInputs::new(&name, *inputs);
                    i.metadata.uid = Some(format!("uid-inputs-{name}"));
                    i.metadata.generation = Some(1);
                    upsert(&mut s.revision_inputs, i);
                }
                Intent::RevisionStatus { name, status } => {
                    let Some(r) = s
                        .revisions
                        .iter_mut()
                        .find(|r| r.metadata.name.as_deref() == Some(&name))
                    else {
                        continue;
                    };
                    Arc::make_mut(r).status = Some(Arc::unwrap_or_clone(status));
                }
                Intent::ApplyNodeConfig {
                    node,
                    spec,
                    assigned_at,
                    ..
                } => {
                    let status = s
                        .node_configs
                        .iter()
                        .find(|c| c.metadata.name.as_deref() == Some(&node))
                        .and_then(|c| c.status.clone());
                    let mut c = NodeNetworkConfig::new(&node, *spec);
                    c.metadata.uid = Some(format!("uid-nnc-{node}"));
                    c.metadata.generation = Some(generation);
                    // As the configurator's cache keeps it: the verified config dropped.
                    c.spec.config = Default::default();
                    c.metadata.annotations = Some(
                        [
                            (
                                ASSIGNED_AT_ANNOTATION.to_string(),
                                // Stamped when sent, as the writer does: at `now`.
                                assigned_at.unwrap_or_else(|| now.to_rfc3339()),
                            ),
                            (crate::watch::CONFIG_VERIFIED.to_string(), "true".into()),
                        ]
                        .into(),
                    );
                    c.status = status;
                    upsert(&mut s.node_configs, c);
                }
                // Quarantine is off in this bench: no node records or conditions are planned.
                Intent::NodeRecord { .. } | Intent::NodeCondition { .. } => {}
                Intent::QueueNode { node, message, .. } => {
                    let mut c = NodeNetworkConfig::new(&node, NodeNetworkConfigSpec::placeholder());
                    c.metadata.uid = Some(format!("uid-nnc-{node}"));
                    c.metadata.annotations =
                        Some([(QUEUED_ANNOTATION.to_string(), message)].into());
                    upsert(&mut s.node_configs, c);
                }
                Intent::DeleteNodeConfig { name } => s
                    .node_configs
                    .retain(|c| c.metadata.name.as_deref() != Some(&name)),
                Intent::DeleteRevision { name } => {
                    s.revisions
                        .retain(|c| c.metadata.name.as_deref() != Some(&name));
                    s.revision_inputs
                        .retain(|c| c.metadata.name.as_deref() != Some(&name));
                }
                Intent::InputStatus {
                    kind, name, status, ..
                } => {
                    s.inputs.set_status(kind, &name, Some(*status));
                }
                Intent::HoldRevision { hold: h, .. } => {
                    if let Some(r) = s
                        .revisions
                        .iter_mut()
                        .find(|r| r.metadata.name.as_deref() == Some(&h.revision))
                    {
                        let r = Arc::make_mut(r);
                        r.spec.paused = true;
                        r.metadata.annotations = Some(
                            [
                                (
                                    netwave_core::revision::DESTRUCTIVE_CHANGE_ANNOTATION
                                        .to_string(),
                                    h.summary.clone(),
                                ),
                                (
                                    netwave_core::revision::DESTRUCTIVE_CHANGE_BASIS_ANNOTATION
                                        .to_string(),
                                    h.basis.clone(),
                                ),
                            ]
                            .into(),
                        );
                    }
                }
                Intent::RestoreRevisionSpec { .. }
                | Intent::ReactivateRevision { .. }
                | Intent::Event { .. } => {}
            }
        }
    }
}
