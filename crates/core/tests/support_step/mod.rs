//! The step driver shared by the rollout rule tests and the hold tests.

use netwave_core::Timestamp;
use netwave_core::rollout::{Plan, step};
use netwave_core::sim::Store;

/// Steps, applies the whole plan, and checks that a second step over the result plans nothing.
pub fn run(store: &mut Store, now: Timestamp) -> Plan {
    let plan = step(&store.input(), now);
    store.apply_plan(&plan).expect("plan applies");
    let again = step(&store.input(), now);
    assert!(
        again.is_empty(),
        "stepping again over the applied plan must plan nothing, got {again:#?}"
    );
    plan
}
