//! The harness itself: nodes reach each other over the fabric, and nothing is left behind — not after a
//! normal drop, not after a panic.

use netwave_e2e::netns::{NetnsFleet, is_root, namespaces_of};

#[test]
fn nodes_reach_each_other_over_the_fabric_and_drop_removes_everything() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to create network namespaces");
        return;
    }
    let mut fleet = NetnsFleet::build(3).unwrap();
    let run = fleet.run_id.clone();
    assert_eq!(namespaces_of(&run).len(), 4, "fabric + 3 nodes");
    assert!(
        fleet.ping("node-0", "198.18.0.3").unwrap(),
        "node-0 reaches node-2's underlay"
    );
    let joined = fleet.add_node().unwrap();
    assert!(
        fleet.ping(&joined.name, "198.18.0.1").unwrap(),
        "a node added later is wired too"
    );
    fleet.remove_node("node-1").unwrap();
    assert!(
        !fleet.ping("node-0", "198.18.0.2").unwrap(),
        "a removed node is gone"
    );
    drop(fleet);
    assert_eq!(namespaces_of(&run), Vec::<String>::new());
}

#[test]
fn a_panicking_test_still_cleans_up() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to create network namespaces");
        return;
    }
    let run = std::panic::catch_unwind(|| {
        let fleet = NetnsFleet::build(2).unwrap();
        let run = fleet.run_id.clone();
        std::panic::panic_any(run);
    })
    .unwrap_err();
    let run = run.downcast::<String>().unwrap();
    assert_eq!(namespaces_of(&run), Vec::<String>::new());
}
