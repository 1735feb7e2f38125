//! The harness itself: nodes reach each other over the fabric, and nothing is left behind — not after a
//! normal drop, not after a panic.

use netwave_e2e::fleet::{Fleet, MACHINE_LOCK};
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

/// Fleets wire the same host address into the root namespace, so test binaries run side by side
/// (`tests/run-suites.sh`) must not build theirs at once: [`Fleet::lock`] holds a machine-wide lock that
/// another open of the lock file (as another process makes) cannot take until the guard is dropped.
#[tokio::test]
async fn the_fleet_lock_keeps_other_processes_out_until_released() {
    let path = std::env::temp_dir().join(MACHINE_LOCK);
    let guard = Fleet::lock().await;
    let other = std::fs::File::open(&path).unwrap();
    assert!(
        matches!(other.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        "another process could take {} while a fleet holds it",
        path.display()
    );
    drop(guard);
    other
        .try_lock()
        .expect("the lock is free once the guard is dropped");
}
