//! DESIGN.md §6, "Sizes are validated": inputs that fold into more than one object can hold, and a node
//! config larger than one NodeNetworkConfig can hold, are refused before anything is written, saying
//! how big, the limit, and the largest objects (and nodes) responsible.

mod support_inputs;
mod support_step;

use netwave_api::NamedRoutingTable;
use netwave_api::vocab::{ConditionStatus, NodePhase, RevisionPhase, accepted_reasons};
use netwave_core::Timestamp;
use netwave_core::fleet::{Check, FleetParams, render_and_validate};
use netwave_core::limits::{self, check_inputs, json_bytes};
use netwave_core::render::{InputKind, InputRef, NodeInfo};
use netwave_core::revision::canonical_inputs;
use netwave_core::rollout::{ObjectVerdict, input_status_uncut};
use netwave_core::sim::Store;
use support_inputs::*;

fn nodes() -> Vec<NodeInfo> {
    vec![
        node("n-compute-1", &[("pool", "compute")]),
        node("n-storage-1", &[("pool", "storage")]),
        node("n-storage-2", &[("pool", "storage")]),
    ]
}

/// A routing table with `n` routes.
fn table(name: &str, id: u32, n: usize) -> NamedRoutingTable {
    let mut t = rt(name, id);
    t.spec.routes = (0..n)
        .map(|i| {
            route(
                &format!("10.{}.{}.0/24", i / 256, i % 256),
                Some("192.0.2.1"),
                None,
            )
        })
        .collect();
    t
}

/// The folded inputs are measured as they are stored (the canonical NetworkConfigInputs spec); over the
/// limit they are refused with the size, the limit and the three largest objects, largest first.
#[test]
fn inputs_that_do_not_fit_one_object_are_refused_naming_size_limit_and_largest_objects() {
    let ins = inputs(
        vec![],
        vec![l2("seg", 10, 10)],
        vec![
            table("rt-100", 100, 100),
            table("rt-300", 300, 300),
            table("rt-200", 200, 200),
            table("rt-50", 50, 50),
        ],
    );
    let stored = serde_json::to_vec(&canonical_inputs(&ins)).unwrap().len() as u64;
    assert_eq!(json_bytes(&ins), stored, "what the API server stores");
    assert_eq!(
        check_inputs(&ins, stored),
        Ok(stored),
        "exactly at the limit fits"
    );

    let err = check_inputs(&ins, stored - 1).unwrap_err();
    assert_eq!((err.bytes, err.limit, err.objects), (stored, stored - 1, 5));
    let largest: Vec<&str> = err.largest.iter().map(|c| c.object.name.as_str()).collect();
    assert_eq!(largest, ["rt-300", "rt-200", "rt-100"]);
    assert_eq!(
        err.largest(),
        Some(&InputRef::new(InputKind::RoutingTable, "rt-300"))
    );
    let text = err.to_string();
    for want in [
        format!("({stored} bytes)"),
        format!("({} bytes) set by --max-object-bytes", stored - 1),
        "no revision is cut from them".into(),
        "the largest of the 5 are RoutingTable/rt-300 (".into(),
        "RoutingTable/rt-100 (".into(),
    ] {
        assert!(text.contains(&want), "{want:?} in {text}");
    }
    assert!(!text.contains("rt-50"), "only the three largest: {text}");
}

/// Every input object's `Accepted` says the inputs cannot become a revision and why: `RevisionInvalid`
/// for a fine object, `Invalid` for one with errors of its own (both listed), and no revision named.
#[test]
fn inputs_too_large_are_not_accepted_and_name_no_revision() {
    let problem = check_inputs(&inputs(vec![], vec![], vec![table("t", 1, 10)]), 100)
        .unwrap_err()
        .to_string();
    let fine = ObjectVerdict {
        selected_nodes: 3,
        ..ObjectVerdict::default()
    };
    let st = input_status_uncut(&fine, &problem, Some(2), None, Timestamp(1_000));
    let c = st.accepted().unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        (
            ConditionStatus::False.as_str(),
            accepted_reasons::REVISION_INVALID
        )
    );
    assert!(c.message.ends_with(&problem), "{}", c.message);
    assert_eq!((st.revision, st.selected_nodes), (None, Some(3)));
    let bad = ObjectVerdict {
        errors: vec!["spec.tableId: reserved".into()],
        ..fine
    };
    let c = input_status_uncut(&bad, &problem, Some(2), None, Timestamp(1_000));
    let c = c.accepted().unwrap();
    assert_eq!(c.reason, NodePhase::Invalid.as_str());
    assert!(
        c.message.contains("spec.tableId") && c.message.contains("no revision is cut"),
        "{}",
        c.message
    );
}

/// A node config larger than one object fails the revision's validation, naming the nodes that would get
/// it and the largest objects they select; nodes with smaller configs are not named. The step then
/// fails the revision without assigning it to any node (the rule for every validation error).
#[test]
fn a_node_config_that_does_not_fit_one_object_fails_the_revision_naming_its_nodes() {
    let mut storage = table("storage-routes", 200, 400);
    storage.spec.node_selector = match_labels(&[("pool", "storage")]);
    let mut small = table("compute-routes", 201, 10);
    small.spec.node_selector = match_labels(&[("pool", "compute")]);
    let ins = inputs(vec![], vec![l2("seg", 10, 10)], vec![storage, small]);
    let fits = render_and_validate(&ins, &nodes(), &FleetParams::default());
    assert!(fits.validation.errors.is_empty(), "{:?}", fits.validation);
    let storage_bytes = json_bytes(&fits.nodes["n-storage-1"].config());
    let compute_bytes = json_bytes(&fits.nodes["n-compute-1"].config());
    assert!(compute_bytes < storage_bytes);

    let params = FleetParams {
        max_object_bytes: storage_bytes - 1,
        ..FleetParams::default()
    };
    let checked = render_and_validate(&ins, &nodes(), &params);
    let errors = &checked.validation.errors;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].check, Check::NodeConfigTooLarge);
    assert_eq!(errors[0].nodes, ["n-storage-1", "n-storage-2"]);
    let text = errors[0].to_string();
    for want in [
        format!("is {}", limits::Bytes(storage_bytes)),
        format!("({} bytes) set by --max-object-bytes", storage_bytes - 1),
        "no node gets this revision".into(),
        "the largest are RoutingTable/storage-routes (".into(),
        "Layer2NetworkConfiguration/seg (".into(),
        "(nodes: n-storage-1, n-storage-2)".into(),
    ] {
        assert!(text.contains(&want), "{want:?} in {text}");
    }
    assert!(
        !text.contains("compute-routes"),
        "not on these nodes: {text}"
    );

    // The revision with this validation never reaches a node.
    let mut store = Store::with_nodes(&["n-compute-1", "n-storage-1", "n-storage-2"]);
    store.add_revision("r1", 1).validation = checked.validation.to_status();
    let plan = support_step::run(&mut store, Timestamp(1_700_000_000_000));
    assert!(plan.assignments.is_empty(), "{:?}", plan.assignments);
    assert_eq!(
        store.revisions["r1"].status.phase.as_deref(),
        Some(RevisionPhase::Failed.as_str())
    );
    assert_eq!(
        store.revisions["r1"].status.validation.errors,
        [text],
        "the revision's status says which nodes and why"
    );
}
