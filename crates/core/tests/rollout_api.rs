//! The edge between API objects and step input: what the configurator writes reads back the same.

use netwave_api::vocab::{ConditionStatus, NodePhase, NodeReason, node_conditions};
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use netwave_api::{
    NetworkConfigRevision, NetworkConfigRevisionSpec, NodeConfig, NodeNetworkConfig,
    NodeNetworkConfigSpec, NodeNetworkConfigStatus, ValidationResult,
};
use netwave_core::rollout::{
    AgentPhase, AssignReason, Assignment, NodeConfigState, NodeState, RevisionState,
};
use netwave_core::{Sequence, Timestamp};

#[test]
fn an_assignment_written_as_annotation_reads_back_as_the_same_assignment_time() {
    let a = Assignment {
        node: "node-1".into(),
        create: true,
        revision: "rev-1".into(),
        sequence: Sequence(3),
        config_hash: "abc".into(),
        retry: 2,
        assigned_at: Timestamp(1_800_000_000_123),
        reason: AssignReason::Rollout,
    };
    let (key, value) = a.assigned_at_annotation();
    let nnc = NodeNetworkConfig {
        metadata: ObjectMeta {
            name: Some("node-1".into()),
            annotations: Some(BTreeMap::from([(key.to_string(), value)])),
            ..ObjectMeta::default()
        },
        spec: NodeNetworkConfigSpec {
            revision: a.revision.to_string(),
            sequence: 3,
            config_hash: a.config_hash.to_string(),
            retry: a.retry,
            config: NodeConfig::default(),
        },
        status: Some(NodeNetworkConfigStatus {
            phase: Some(NodePhase::Invalid.as_str().into()),
            observed_revision: Some("rev-1".into()),
            observed_retry: Some(2),
            reason: Some(NodeReason::HealthCheckFailed.as_str().into()),
            ..NodeNetworkConfigStatus::default()
        }),
    };
    let state = NodeConfigState::from_api(&nnc).unwrap();
    assert_eq!(state.spec.assigned_at, Some(a.assigned_at));
    assert_eq!(state.spec.retry, 2);
    assert_eq!(state.status.phase, Some(AgentPhase::Invalid));
    assert_eq!(
        state.status.reason.as_deref(),
        Some(NodeReason::HealthCheckFailed.as_str())
    );

    // An unreadable annotation reads as missing (the step re-stamps it).
    let mut broken = nnc.clone();
    broken
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(key.to_string(), "soon".into());
    assert_eq!(
        NodeConfigState::from_api(&broken).unwrap().spec.assigned_at,
        None
    );
}

#[test]
fn nodes_are_ready_only_with_a_true_ready_condition_and_cordon_is_unschedulable() {
    let node = |ready: &str, unschedulable: Option<bool>| Node {
        metadata: ObjectMeta {
            name: Some("n".into()),
            labels: Some(BTreeMap::from([("zone".into(), "a".into())])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            unschedulable,
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: node_conditions::READY.into(),
                status: ready.into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    };
    let ready = NodeState::from_api(&node(ConditionStatus::True.as_str(), None)).unwrap();
    assert!(ready.ready && !ready.unschedulable && ready.eligible());
    assert_eq!(ready.labels["zone"], "a");
    assert!(
        !NodeState::from_api(&node(ConditionStatus::Unknown.as_str(), None))
            .unwrap()
            .ready
    );
    assert!(
        !NodeState::from_api(&node(ConditionStatus::True.as_str(), Some(true)))
            .unwrap()
            .eligible()
    );
    assert!(NodeState::from_api(&Node::default()).is_err(), "no name");
}

#[test]
fn a_revision_keeps_its_knobs_status_and_validation() {
    let mut rev = NetworkConfigRevision::new(
        "rev-9",
        NetworkConfigRevisionSpec {
            hash: "h".into(),
            sequence: 9,
            rollout: Default::default(),
            paused: true,
            retry: 1,
        },
    );
    rev.metadata.generation = Some(4);
    let validation = ValidationResult {
        errors: vec![],
        warnings: vec!["w".into()],
    };
    let state = RevisionState::from_api(&rev, validation.clone()).unwrap();
    assert_eq!(
        (state.sequence, state.paused, state.retry, state.generation),
        (Sequence(9), true, 1, Some(4))
    );
    assert_eq!(state.validation, validation);
    assert_eq!(state.status, Default::default());
}
