//! A configurator meets a fleet rolled out by a configurator that renders differently (#46): an
//! upgrade or a downgrade of the configurator across a `RENDER_VERSION` bump. It never rewrites the
//! node configs of that revision in place; it cuts a revision of its own version from the same inputs,
//! which rolls out in waves under the gate, and a failure of that rollout holds the fleet where it is
//! (the other version's configs are not this configurator's to put back).
//!
//! In memory (`testing::inmem`), with agents answering as real ones do (`netwave_agent::sim`).

mod support_inmem;

use std::collections::BTreeSet;
use std::sync::Arc;

use netwave_agent::sim::Answer;
use netwave_api::vocab::NodeReason;
use netwave_api::vocab::RevisionPhase;
use netwave_configurator::decide::Outcome;
use netwave_configurator::snapshot::{Snapshot, fold_inputs};
use netwave_configurator::testing::inmem;
use netwave_configurator::writer::Intent;
use netwave_core::render::{RENDER_VERSION, config_hash, stamp_render_version};
use netwave_core::revision::{inputs_hash, revision_name};
use netwave_core::rollout::WaitingOn;
use support_inmem::{Leader, answer, phase_of, provisioned};

const NODES: usize = 20;

/// The samples rolled out on every node, then relabelled as the work of a configurator that renders
/// version `RENDER_VERSION + 1`: its revision records that version (and so hashes and is named apart),
/// and every node runs its rendering, which differs from this build's (one VRF's MTU). Returns the
/// snapshot and the other revision's name.
fn fleet_of_another_render_version() -> (Snapshot, String) {
    let mut s = inmem::samples_snapshot((0..NODES).map(|i| format!("node-{i:02}")));
    let mut leader = Leader::new();
    for _ in 0..200 {
        leader.reconcile(&mut s);
        answer(&mut s, provisioned);
        if s.revisions.len() == 1
            && phase_of(&s, s.revisions[0].metadata.name.as_deref().unwrap())
                == Some(RevisionPhase::Complete.as_str().into())
        {
            break;
        }
    }
    let [revision] = s.revisions.as_slice() else {
        panic!("one revision, got {}", s.revisions.len());
    };
    assert_eq!(
        phase_of(&s, revision.metadata.name.as_deref().unwrap()).as_deref(),
        Some("Complete")
    );
    let mut inputs = (*s.revision_inputs[0]).clone();
    stamp_render_version(&mut inputs.spec, RENDER_VERSION + 1);
    let hash = inputs_hash(&inputs.spec);
    let name = revision_name(&hash);
    inputs.metadata.name = Some(name.clone());
    inputs.metadata.uid = Some(format!("uid-inputs-{name}"));
    let mut other = (**revision).clone();
    other.metadata.name = Some(name.clone());
    other.metadata.uid = Some(format!("uid-{name}"));
    other.spec.hash = hash;
    s.revisions = vec![Arc::new(other)];
    s.revision_inputs = vec![Arc::new(inputs)];
    for c in s.node_configs.iter_mut() {
        let c = Arc::make_mut(c);
        c.spec.revision = name.clone();
        for vrf in c.spec.config.vrfs.iter_mut().take(1) {
            vrf.mtu -= 50;
        }
        c.spec.config_hash = config_hash(&c.spec.config);
        c.status = None;
    }
    answer(&mut s, provisioned);
    s.changed_by_hand(BTreeSet::new(), BTreeSet::new());
    (s, name)
}

/// The nodes an outcome assigns a config of `revision`.
fn assigned(out: &Outcome, revision: &str) -> Vec<String> {
    (out.intents.iter())
        .filter_map(|i| match i {
            Intent::ApplyNodeConfig { node, spec, .. } if spec.revision == revision => {
                Some(node.clone())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_configurator_that_renders_differently_cuts_a_revision_and_rolls_it_out_in_waves() {
    let (mut s, other) = fleet_of_another_render_version();
    let mut leader = Leader::new();

    // The same inputs, cut for this build's version: a new revision, and nothing else this reconcile.
    let out = leader.reconcile(&mut s);
    let own = revision_name(&inputs_hash(&fold_inputs(&s)));
    assert_ne!(own, other);
    let [Intent::CreateRevision { name, inputs, .. }] = out.intents.as_slice() else {
        panic!("one CreateRevision, got {:#?}", out.intents);
    };
    assert_eq!((name, inputs.render_version), (&own, None));

    // It rolls out in waves: never more nodes at once than the budget, and never a config of the
    // other version's revision rewritten (its nodes keep it until their wave moves them).
    let mut first_wave = None;
    for _ in 0..200 {
        let out = leader.reconcile(&mut s);
        assert!(
            assigned(&out, &other).is_empty(),
            "the other version's configs are never rewritten: {:#?}",
            out.intents
        );
        let wave = assigned(&out, &own).len();
        if wave > 0 && first_wave.is_none() {
            first_wave = Some(wave);
        }
        answer(&mut s, provisioned);
        if phase_of(&s, &own).as_deref() == Some("Complete") {
            break;
        }
    }
    let first_wave = first_wave.expect("the new revision was assigned");
    assert!(
        first_wave < NODES,
        "the first wave took {first_wave} of {NODES} nodes at once"
    );
    assert_eq!(phase_of(&s, &own).as_deref(), Some("Complete"));
    assert!(
        s.node_configs.iter().all(|c| c.spec.revision == own),
        "every node moved to this version's revision"
    );
}

#[test]
fn a_failed_rollout_holds_where_it_is_when_the_last_good_revision_is_another_versions() {
    let (mut s, other) = fleet_of_another_render_version();
    let mut leader = Leader::new();
    let failing: BTreeSet<String> = s
        .node_configs
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    let own = revision_name(&inputs_hash(&fold_inputs(&s)));
    let mut waiting = Vec::new();
    for _ in 0..200 {
        let out = leader.reconcile(&mut s);
        assert!(
            assigned(&out, &other).is_empty(),
            "nothing is put back on the other version's revision: {:#?}",
            out.intents
        );
        if let Some(plan) = &out.plan {
            waiting = plan.report.waiting.clone();
        }
        answer(&mut s, |node| {
            if failing.contains(node) {
                Answer::Invalid {
                    reason: NodeReason::HealthCheckFailed,
                    message: "reachability: 198.18.0.1 unreachable".into(),
                }
            } else {
                Answer::Provisioned
            }
        });
        if phase_of(&s, &own).as_deref() == Some("Failed") {
            let out = leader.reconcile(&mut s);
            assert!(assigned(&out, &other).is_empty());
            waiting = out.plan.expect("a plan").report.waiting;
            break;
        }
    }
    assert_eq!(phase_of(&s, &own).as_deref(), Some("Failed"));
    let Some(WaitingOn::OtherRenderVersion {
        revision,
        version,
        count,
        ..
    }) = waiting
        .iter()
        .find(|w| matches!(w, WaitingOn::OtherRenderVersion { .. }))
    else {
        panic!("the report says why nothing goes back: {waiting:#?}");
    };
    assert_eq!((revision, *version), (&other, RENDER_VERSION + 1));
    let touched = s
        .node_configs
        .iter()
        .filter(|c| c.spec.revision == own)
        .count();
    assert_eq!(*count as usize, touched, "{waiting:#?}");
    assert!(
        touched < NODES,
        "the failure stopped the rollout: {touched} of {NODES} nodes were given it"
    );
    let message = WaitingOn::OtherRenderVersion {
        revision: other.clone(),
        version: RENDER_VERSION + 1,
        count: 1,
        first: vec!["node-00".into()],
    }
    .to_string();
    assert!(
        message.contains(&format!(
            "was cut for render version {} and this configurator renders version {RENDER_VERSION}",
            RENDER_VERSION + 1
        )),
        "{message}"
    );
}
