//! A node is failed by a timeout on a fresh read, never on a cache that is behind (#28,
//! `netwave_configurator::recheck`): the leader's plan on a snapshot whose watch has not delivered the
//! agent's `Provisioning` yet fails the node by `PickupTimeout`; decided again with the node config as
//! the API server has it, it does not. An agent that keeps its node config changing (so that the
//! cache is always behind) without ever reporting on the attempt is failed all the same.

use std::collections::BTreeSet;
use std::sync::Arc;

use netwave_agent::sim::{Answer, provisioning_for};
use netwave_api::NodeNetworkConfig;
use netwave_configurator::decide::{Outcome, Settings, compute};
use netwave_configurator::memory::Memory;
use netwave_configurator::recheck::new_timeouts;
use netwave_configurator::snapshot::Snapshot;
use netwave_configurator::testing::inmem::{self, apply};
use netwave_core::Timestamp;
use netwave_core::revision::InputSettle;
use netwave_core::rollout::Plan;

const NODE: &str = "node-1";

/// The configurator's defaults, with a pickup timeout of 10 s within an apply timeout of 600 s.
fn settings() -> Settings {
    let mut settings = inmem::settings();
    settings.defaults.apply_timeout_seconds = 600;
    settings.defaults.pickup_timeout_seconds = Some(10);
    settings
}

struct Leader {
    settings: Settings,
    cache: Memory,
    settle: InputSettle,
}

impl Leader {
    fn plan(&mut self, s: &Snapshot, now: Timestamp) -> Outcome {
        compute(s, &self.settings, &mut self.cache, &mut self.settle, now)
    }

    /// The nodes the plan on `s` at `now` fails by a timeout not on record yet, and the plan.
    fn new_timeouts(&mut self, s: &Snapshot, now: Timestamp) -> (BTreeSet<String>, Plan) {
        let plan = self.plan(s, now).plan.expect("a plan");
        (new_timeouts(s, &plan), plan)
    }
}

/// The node's config in `s`, with `status` and a newer resourceVersion: what the API server holds
/// after the agent wrote it, before the watch delivered it.
fn stored_after_agent_wrote(
    s: &Snapshot,
    status: netwave_api::NodeNetworkConfigStatus,
    version: &str,
) -> Arc<NodeNetworkConfig> {
    let mut c = s
        .node_config(NODE)
        .expect("the node's config")
        .as_ref()
        .clone();
    c.status = Some(status);
    c.metadata.resource_version = Some(version.into());
    Arc::new(c)
}

#[test]
fn a_timeout_decided_on_a_cache_that_is_behind_is_decided_again_on_the_fresh_object() {
    let mut s = inmem::samples_snapshot([NODE.to_string()]);
    s.changed_by_hand(BTreeSet::new(), BTreeSet::new());
    let mut leader = Leader {
        settings: settings(),
        cache: Memory::default(),
        settle: InputSettle::default(),
    };
    // The rollout assigns the node its first revision; its agent has not been heard from.
    let t0 = netwave_configurator::clock::now();
    for _ in 0..10 {
        let out = leader.plan(&s, t0);
        apply(&mut s, out.intents, t0);
        s.changed_by_hand(BTreeSet::new(), [NODE.to_string()].into());
        if s.node_config(NODE)
            .is_some_and(|c| !c.spec.is_placeholder())
        {
            break;
        }
    }
    let assigned = s.node_config(NODE).expect("the node's config").clone();
    assert!(
        !assigned.spec.is_placeholder(),
        "the node was never assigned"
    );

    // 11 s on, the cache shows no report: the plan fails the node by PickupTimeout.
    let later = Timestamp(t0.0 + 11_000);
    let (failing, plan) = leader.new_timeouts(&s, later);
    assert_eq!(failing, BTreeSet::from([NODE.to_string()]), "{plan:#?}");

    // Read again, the node config is the very version the cache holds: the failure stands.
    assert!(
        s.with_fresh_configs(vec![(NODE.into(), Some(assigned.clone()))])
            .is_none()
    );

    // The agent's Provisioning was stored in time; the watch had not delivered it. Decided again on
    // the fresh object, the node is not failed.
    let provisioning =
        provisioning_for(&assigned, &Answer::Provisioned).expect("an agent that answers");
    let fresh = stored_after_agent_wrote(&s, provisioning, "2");
    let fresher = s
        .with_fresh_configs(vec![(NODE.into(), Some(fresh))])
        .expect("a newer version than the cache's");
    let (failing, plan) = leader.new_timeouts(&fresher, later);
    assert!(failing.is_empty(), "{plan:#?}");
    assert!(
        plan.status_updates
            .iter()
            .all(|u| u.status.failed_nodes.is_empty()),
        "{plan:#?}"
    );

    // An agent that keeps rewriting its status (a newer version every time it is read) without ever
    // reporting on this attempt is failed all the same.
    let mut unrelated = assigned.status.clone().unwrap_or_default();
    unrelated.message = Some("still here (and not applying anything)".into());
    let fresh = stored_after_agent_wrote(&s, unrelated, "3");
    let fresher = s
        .with_fresh_configs(vec![(NODE.into(), Some(fresh))])
        .expect("a newer version than the cache's");
    let (failing, plan) = leader.new_timeouts(&fresher, later);
    assert_eq!(failing, BTreeSet::from([NODE.to_string()]), "{plan:#?}");
}
