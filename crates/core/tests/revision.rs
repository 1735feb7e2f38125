//! Revision hashing, naming and the rules for creating revisions, one test per rule.

mod support_inputs;
mod support_props;

use netwave_api::RevisionInputs;
use netwave_api::vocab::RevisionPhase;
use netwave_core::revision::{
    Decision, ExistingRevision, Naming, Tampered, canonical_inputs, decide, decide_named,
    inputs_hash, name_matches, revision_name, verify,
};
use proptest::prelude::*;
use sha2::Digest;
use support_inputs::*;

fn rev(name: &str, sequence: u64, hash: &str, failed: bool) -> ExistingRevision {
    ExistingRevision {
        name: name.into(),
        sequence,
        hash: hash.into(),
        failed,
        retry: 0,
        observed_retry: failed.then_some(0),
    }
}

const H1: &str = "1111111111aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const H2: &str = "2222222222bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const H3: &str = "3333333333cccccccccccccccccccccccccccccccccccccccccccccccccccccccc";

#[test]
fn first_inputs_create_sequence_one() {
    assert_eq!(
        decide(H1, &[], 0),
        Decision::Create {
            name: "rev-1111111111".into(),
            sequence: 1,
            hash: H1.into()
        }
    );
}

#[test]
fn no_change_when_inputs_equal_the_target() {
    let existing = [rev("rev-1", 1, H1, false), rev("rev-2", 2, H2, false)];
    assert_eq!(
        decide(H2, &existing, 0),
        Decision::NoChange {
            name: "rev-2".into()
        }
    );
}

#[test]
fn target_is_the_newest_revision_that_is_not_failed() {
    // rev-2 failed; the fleet is going back to rev-1, so inputs equal to rev-1 change nothing.
    let existing = [rev("rev-1", 1, H1, false), rev("rev-2", 2, H2, true)];
    assert_eq!(
        decide(H1, &existing, 0),
        Decision::NoChange {
            name: "rev-1".into()
        }
    );
}

#[test]
fn inputs_equal_to_a_failed_revision_are_reported_not_created() {
    let existing = [rev("rev-1", 1, H1, false), rev("rev-2", 2, H2, true)];
    assert_eq!(
        decide(H2, &existing, 0),
        Decision::EqualsFailed {
            name: "rev-2".into()
        }
    );
    // Also when the failed revision is older than the current target.
    let existing = [
        rev("rev-1", 1, H1, false),
        rev("rev-2", 2, H2, true),
        rev("rev-3", 3, H3, false),
    ];
    assert_eq!(
        decide(H2, &existing, 0),
        Decision::EqualsFailed {
            name: "rev-2".into()
        }
    );
}

#[test]
fn inputs_equal_to_an_older_good_revision_reactivate_it_with_the_next_sequence() {
    let existing = [rev("rev-1", 1, H1, false), rev("rev-2", 2, H2, false)];
    assert_eq!(
        decide(H1, &existing, 0),
        Decision::Reactivate {
            name: "rev-1".into(),
            new_sequence: 3
        }
    );
}

#[test]
fn a_retried_failed_revision_counts_as_good_and_is_reactivated() {
    // rev-2 failed, the admin moved on to rev-3, then reverted the inputs to rev-2's and bumped its
    // spec.retry: rev-2 becomes the target again.
    let mut failed = rev("rev-2", 2, H2, true);
    failed.retry = 1;
    let existing = [
        rev("rev-1", 1, H1, false),
        failed,
        rev("rev-3", 3, H3, false),
    ];
    assert_eq!(
        decide(H2, &existing, 0),
        Decision::Reactivate {
            name: "rev-2".into(),
            new_sequence: 4
        }
    );
}

#[test]
fn a_revision_that_failed_again_after_retry_is_failed() {
    let mut r = rev("rev-2", 2, H2, true);
    r.retry = 1;
    r.observed_retry = Some(1);
    assert!(r.is_failed());
    assert_eq!(
        decide(H2, &[rev("rev-1", 1, H1, false), r], 0),
        Decision::EqualsFailed {
            name: "rev-2".into()
        }
    );
}

#[test]
fn a_failed_revision_without_observed_retry_is_failed() {
    let mut r = rev("rev-2", 2, H2, true);
    r.observed_retry = None;
    r.retry = 3;
    assert!(r.is_failed());
}

#[test]
fn changed_inputs_create_with_max_sequence_plus_one() {
    let existing = [rev("rev-1", 7, H1, false), rev("rev-2", 4, H2, true)];
    assert_eq!(
        decide(H3, &existing, 0),
        Decision::Create {
            name: revision_name(H3),
            sequence: 8,
            hash: H3.into()
        }
    );
}

#[test]
fn fail_forward_new_inputs_after_a_failure_create_a_new_target() {
    let existing = [rev("rev-1", 1, H1, false), rev("rev-2", 2, H2, true)];
    assert!(matches!(
        decide(H3, &existing, 0),
        Decision::Create { sequence: 3, .. }
    ));
}

#[test]
fn sequence_stays_monotonic_after_history_deletion_via_the_floor() {
    // Every revision up to 41 was deleted; a NodeNetworkConfig still says sequence 41.
    assert!(matches!(
        decide(H1, &[], 41),
        Decision::Create { sequence: 42, .. }
    ));
    assert!(matches!(
        decide(H1, &[rev("rev-2", 2, H2, false)], 41),
        Decision::Create { sequence: 42, .. }
    ));
}

#[test]
fn name_clash_with_another_hash_lengthens_the_name() {
    // Same first 10 hex digits, different hash.
    let other = "1111111111ffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
    let existing = [rev(&revision_name(other), 1, other, false)];
    assert_eq!(
        decide(H1, &existing, 0),
        Decision::Create {
            name: "rev-1111111111aaaaaa".into(),
            sequence: 2,
            hash: H1.into()
        }
    );
}

#[test]
fn revision_name_is_dns_1123() {
    let name = revision_name(&inputs_hash(&sample_inputs()));
    assert_eq!(name.len(), 14);
    assert!(name.starts_with("rev-"));
    assert!(
        name.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    );
}

#[test]
fn from_object_reads_phase_sequence_hash_and_retry() {
    let mut ncr = netwave_api::NetworkConfigRevision::new(
        "rev-abc",
        netwave_api::NetworkConfigRevisionSpec {
            hash: H1.into(),
            sequence: 5,
            rollout: Default::default(),
            paused: false,
            retry: 2,
        },
    );
    ncr.status = Some(netwave_api::NetworkConfigRevisionStatus {
        phase: Some(RevisionPhase::Failed.as_str().into()),
        observed_retry: Some(1),
        ..Default::default()
    });
    let r = ExistingRevision::from_object(&ncr);
    assert_eq!(
        r,
        ExistingRevision {
            name: "rev-abc".into(),
            sequence: 5,
            hash: H1.into(),
            failed: true,
            retry: 2,
            observed_retry: Some(1)
        }
    );
    assert!(!r.is_failed(), "retry 2 re-arms a failure of attempt 1");
}

// ---- hashing ----

#[test]
fn sample_inputs_hash_is_pinned() {
    // If this changes with the samples unchanged, every cluster makes a new (no-op) revision on upgrade:
    // change it only on purpose (last: the samples select nodes by node-restriction.kubernetes.io/
    // labels, which no node can set on itself).
    assert_eq!(
        inputs_hash(&sample_inputs()),
        "3b99409e0191ae25e5b309ea8eecf493901f3990a2bbf4bf8ec75775d48f38b6"
    );
}

#[test]
fn hash_is_sha256_of_the_canonical_snapshot() {
    let inputs = sample_inputs();
    let canonical = canonical_inputs(&inputs);
    let want = hex::encode(sha2::Sha256::digest(
        serde_json::to_vec(&canonical).unwrap(),
    ));
    assert_eq!(inputs_hash(&inputs), want);
    assert_eq!(inputs_hash(&canonical), want);
    let names: Vec<&str> = canonical.vrfs.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["backup", "cluster", "internet", "storage"]);
}

#[test]
fn any_change_to_a_spec_changes_the_hash() {
    let base = sample_inputs();
    let mut changed = base.clone();
    changed.layer2s[3].spec.mtu -= 1;
    assert_ne!(inputs_hash(&base), inputs_hash(&changed));
    let mut renamed = base.clone();
    renamed.routing_tables[0].name.push('x');
    assert_ne!(inputs_hash(&base), inputs_hash(&renamed));
}

fn shuffle<T>(v: &mut [T], mut seed: u64) {
    for i in (1..v.len()).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, (seed >> 33) as usize % (i + 1));
    }
}

proptest! {
    #![proptest_config(support_props::config(64, "proptest-regressions/revision.txt"))]

    #[test]
    fn hash_is_independent_of_object_order(seed in any::<u64>()) {
        let inputs = sample_inputs();
        let mut shuffled = inputs.clone();
        shuffle(&mut shuffled.vrfs, seed);
        shuffle(&mut shuffled.layer2s, seed ^ 7);
        shuffle(&mut shuffled.routing_tables, seed ^ 13);
        prop_assert_eq!(inputs_hash(&inputs), inputs_hash(&shuffled));
        prop_assert_eq!(canonical_inputs(&inputs), canonical_inputs(&shuffled));
    }

    #[test]
    fn hash_survives_a_json_round_trip(seed in any::<u64>(), keep in 0usize..12) {
        // Stored in the API server as JSON and read back by another configurator replica.
        let mut inputs = sample_inputs();
        shuffle(&mut inputs.layer2s, seed);
        inputs.layer2s.truncate(keep);
        let back: RevisionInputs =
            serde_json::from_str(&serde_json::to_string(&inputs).unwrap()).unwrap();
        prop_assert_eq!(inputs_hash(&inputs), inputs_hash(&back));
    }

    #[test]
    fn decide_never_reuses_a_sequence(seqs in prop::collection::vec((1u64..50, any::<bool>()), 0..8), floor in 0u64..60) {
        let existing: Vec<ExistingRevision> = seqs
            .iter()
            .enumerate()
            .map(|(i, (s, f))| rev(&format!("rev-{i}"), *s, &format!("{i:064x}"), *f))
            .collect();
        let max = existing.iter().map(|r| r.sequence).max().unwrap_or(0).max(floor);
        match decide(H3, &existing, floor) {
            Decision::Create { sequence, .. } => prop_assert_eq!(sequence, max + 1),
            other => prop_assert!(false, "new hash must create, got {:?}", other),
        }
    }
}

#[test]
fn a_revision_as_created_verifies() {
    let inputs = canonical_inputs(&sample_inputs());
    let hash = inputs_hash(&inputs);
    assert_eq!(verify(&revision_name(&hash), &hash, &inputs), Ok(()));
    // A lengthened name (after a clash) belongs to the hash too.
    let long = format!("rev-{}", &hash[..16]);
    assert_eq!(verify(&long, &hash, &inputs), Ok(()));
}

#[test]
fn edited_inputs_do_not_verify_and_the_error_says_what_to_edit_instead() {
    let mut inputs = canonical_inputs(&sample_inputs());
    let hash = inputs_hash(&inputs);
    let name = revision_name(&hash);
    inputs.routing_tables[0].spec.routes[0].via = Some("10.0.0.99".into());
    let err = verify(&name, &hash, &inputs).unwrap_err();
    assert!(matches!(err, Tampered::Inputs { ref recorded, .. } if recorded == &hash));
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("inputs: NetworkConfigInputs {name} hashes to")),
        "{msg}"
    );
    assert!(
        msg.contains("edit the VRF, layer-2 and routing-table objects"),
        "{msg}"
    );
}

#[test]
fn a_hash_edited_to_match_edited_inputs_no_longer_matches_the_name() {
    let mut inputs = canonical_inputs(&sample_inputs());
    let name = revision_name(&inputs_hash(&inputs));
    inputs.routing_tables[0].spec.routes[0].via = Some("10.0.0.99".into());
    let forged = inputs_hash(&inputs);
    assert!(matches!(
        verify(&name, &forged, &inputs),
        Err(Tampered::Name { .. })
    ));
    assert!(!name_matches("rev-12345", "12345aaaaaaaaaaa"), "too short");
    assert!(!name_matches("vrf-1234567890", "1234567890aaaa"), "prefix");
    assert!(name_matches("rev-ABCDEF0123", "abcdef0123ffff"));
    // The sequenced form (`--revision-names=sequence`) carries the same hash digits.
    assert!(name_matches("rev-00000007-abcdef0123", "abcdef0123ffff"));
    assert!(!name_matches("rev-00000007-abcdef0124", "abcdef0123ffff"));
    assert!(!name_matches("rev-0000x007-abcdef0123", "abcdef0123ffff"));
    assert!(!name_matches("rev--abcdef0123", "abcdef0123ffff"));
    assert!(
        !name_matches("rev-00000007-abcde", "abcde00000ffff"),
        "too short"
    );
}

/// Sequenced names sort as the sequences do, so the API server (which lists by name) and `kubectl get
/// ncr` list revisions in creation order; a clash lengthens the hash digits as for hash names.
#[test]
fn sequenced_names_sort_by_sequence() {
    let hashes = [
        "f0", "0a", "9c", "33", "e1", "01", "77", "b5", "4d", "c2", "5e",
    ]
    .map(|h| format!("{h}{}", "0".repeat(62)));
    let mut existing = Vec::new();
    for (i, hash) in hashes.iter().enumerate() {
        let Decision::Create { name, sequence, .. } =
            decide_named(hash, &existing, 0, Naming::Sequence)
        else {
            panic!("new inputs create a revision")
        };
        assert_eq!(sequence, i as u64 + 1);
        assert!(name_matches(&name, hash), "{name}");
        existing.push(rev(&name, sequence, hash, false));
    }
    let names: Vec<&str> = existing.iter().map(|r| r.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(names[10], "rev-00000011-5e00000000");
    // Another hash with the same leading digits and the same sequence (an older leader's cut).
    let clash = format!("5e{}", "1".repeat(62));
    let existing = [rev("rev-00000001-5e11111111", 0, &hashes[0], false)];
    let Decision::Create { name, .. } = decide_named(&clash, &existing, 0, Naming::Sequence) else {
        panic!()
    };
    assert_eq!(name, "rev-00000001-5e11111111111111");
}
