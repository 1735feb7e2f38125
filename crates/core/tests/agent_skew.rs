//! #46, the skew contract: a config is never assigned to a node whose agent lacks a feature the config
//! needs (`netwave_api::features`). Such a node waits for its agent — counted, named, an Event — and
//! gets the revision once its agent declares the feature. Every step goes through `support_step::run`,
//! which also checks that stepping again over the applied plan plans nothing.

mod support_step;

use std::collections::BTreeMap;

use netwave_api::features::FeatureSet;
use netwave_api::vocab::RevisionPhase;
use netwave_core::rollout::{AgentPhase, EventReason, Plan, WaitingOn};
use netwave_core::sim::Store;
use netwave_core::{Sym, Timestamp};
use support_step::run;

const T0: Timestamp = Timestamp(1_700_000_000_000);
const OLD: &str = "node-03";

fn names() -> Vec<String> {
    (1..=4).map(|i| format!("node-{i:02}")).collect()
}

fn fwmark() -> FeatureSet {
    FeatureSet::named(&["ruleFwmark"])
}

/// Four nodes on a completed r1; every agent declares this build's features but node-03's, an agent
/// of 0.1.0 that declares none.
fn fleet() -> Store {
    let mut store = Store::with_nodes(&names());
    store.add_revision("r1", 1);
    for node in names() {
        store.set_running(&node, "r1", T0);
    }
    store
        .configs
        .get_mut(OLD)
        .expect("a config")
        .status
        .features = FeatureSet::NONE;
    run(&mut store, T0);
    store
}

fn declare(store: &mut Store, node: &str) {
    let cfg = store.configs.get_mut(node).expect("a config");
    cfg.status.features = FeatureSet::all();
}

/// `rev` (sequence `seq`) whose config needs the firewall-mark feature on every node.
fn add_needing(store: &mut Store, rev: &str, seq: u64) {
    store.add_revision(rev, seq);
    let needs: BTreeMap<Sym, FeatureSet> = names().iter().map(|n| (n.into(), fwmark())).collect();
    store.rendered.set_needs(rev, needs);
}

/// Steps with every agent answering `Provisioned` until nothing changes; returns the plans.
fn settle(store: &mut Store, t: &mut u64) -> Vec<Plan> {
    let mut plans = Vec::new();
    for _ in 0..40 {
        *t += 1;
        let plan = run(store, T0.plus_secs(*t));
        let pending: Vec<String> = (store.configs.values())
            .filter(|c| c.status.observed_revision.as_deref() != Some(c.spec.revision.as_str()))
            .map(|c| c.name.to_string())
            .collect();
        for node in &pending {
            store.agent_reports(node, AgentPhase::Provisioned, None);
        }
        let done = plan.is_empty() && pending.is_empty();
        plans.push(plan);
        if done {
            return plans;
        }
    }
    panic!("the fleet did not settle");
}

fn assigned(store: &Store, rev: &str) -> Vec<String> {
    (store.configs.values())
        .filter(|c| c.spec.revision == rev)
        .map(|c| c.name.to_string())
        .collect()
}

#[test]
fn a_node_whose_agent_lacks_a_feature_waits_for_its_agent_and_gets_the_revision_once_it_declares_it()
 {
    let mut store = fleet();
    let mut t = 0;
    add_needing(&mut store, "r2", 2);
    let plans = settle(&mut store, &mut t);

    // The old agent's node is never given r2: it would drop the field and report Provisioned.
    assert_eq!(assigned(&store, "r2"), ["node-01", "node-02", "node-04"]);
    assert_eq!(assigned(&store, "r1"), [OLD]);
    let st = &store.revisions["r2"].status;
    assert_eq!(st.phase.as_deref(), Some(RevisionPhase::Complete.as_str()));
    assert_eq!((st.updated, st.skipped, st.waiting_for_agent), (3, 1, 1));
    assert_eq!(st.failed, 0, "waiting is not failing");
    let message = st.message.clone().unwrap_or_default();
    assert!(
        message.contains("1 node(s) wait for their agent")
            && message.contains("ruleFwmark (since 0.2.0)")
            && message.contains(OLD),
        "{message}"
    );
    let waits: Vec<&WaitingOn> = plans.iter().flat_map(|p| &p.report.waiting).collect();
    assert!(
        waits.iter().any(|w| matches!(w,
            WaitingOn::AgentLacksFeatures { count: 1, first, .. } if first == &[OLD])),
        "{waits:#?}"
    );
    // One Event when the node starts waiting, not one per step.
    let events: Vec<_> = (plans.iter().flat_map(|p| &p.events))
        .filter(|e| e.reason == EventReason::WaitingForAgent)
        .collect();
    assert_eq!(events.len(), 1, "{events:#?}");
    assert!(events[0].message.contains(OLD), "{}", events[0].message);

    // The agent is upgraded: it declares the feature, and its node gets r2.
    declare(&mut store, OLD);
    settle(&mut store, &mut t);
    assert_eq!(assigned(&store, "r2"), names());
    let st = &store.revisions["r2"].status;
    assert_eq!((st.updated, st.skipped, st.waiting_for_agent), (4, 0, 0));
}

#[test]
fn a_revision_that_needs_no_new_feature_reaches_the_old_agent_as_before() {
    let mut store = fleet();
    let mut t = 0;
    store.add_revision("r2", 2);
    settle(&mut store, &mut t);
    assert_eq!(assigned(&store, "r2"), names());
    assert_eq!(store.revisions["r2"].status.waiting_for_agent, 0);
}

#[test]
fn a_new_node_starts_on_the_last_good_revision_until_its_agent_declares_the_feature() {
    let mut store = fleet();
    let mut t = 0;
    add_needing(&mut store, "r2", 2);
    declare(&mut store, OLD);
    settle(&mut store, &mut t);
    assert_eq!(assigned(&store, "r2"), names());

    // r3 needs the feature too; a node joins whose agent has not declared anything yet.
    store.add_node("node-05", BTreeMap::new());
    add_needing(&mut store, "r3", 3);
    let needs: BTreeMap<Sym, FeatureSet> = (names().iter().chain(["node-05".to_string()].iter()))
        .map(|n| (n.into(), fwmark()))
        .collect();
    store.rendered.set_needs("r3", needs.clone());
    store.rendered.set_needs("r2", needs);
    settle(&mut store, &mut t);
    assert!(
        !store.configs.contains_key("node-05"),
        "a node whose agent declared nothing gets nothing that needs a feature"
    );
    assert_eq!(store.revisions["r3"].status.waiting_for_agent, 1);

    // Its agent declares the feature on its placeholder: it gets the target.
    store
        .unassigned_agents
        .insert("node-05".into(), FeatureSet::all());
    settle(&mut store, &mut t);
    assert_eq!(
        store
            .configs
            .get("node-05")
            .map(|c| c.spec.revision.as_str()),
        Some("r3")
    );
    assert_eq!(store.revisions["r3"].status.waiting_for_agent, 0);
}
