//! The status of each input object (VRF, layer-2, routing table): whether fleet validation accepts it,
//! how many nodes it selects, and a VRF's table. Pure: the configurator computes the verdicts once per
//! (inputs, node labels) and writes a status only where [`input_status`] differs from the one stored.
//!
//! ```text
//!   inputs + nodes ──► fleet::validate (findings name their objects) ─┐
//!                  ──► render index (selectors per node group, tables) ┴► InputVerdicts
//!   verdict + the revision's own validation + stored status + now ──► input_status ──► InputStatus
//! ```
//!
//! `lastTransitionTime` moves only when `Accepted` changes, and nothing here reads a clock, so stepping
//! twice over the same world yields the stored status and no write: a 2,000-node fleet sees a status
//! write per object only when that object's verdict, node count or table changes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use netwave_api::RevisionInputs;
use netwave_api::input_status::{ACCEPTED, InputStatus, accepted_reasons};

use super::health::{self, Health, Verdict};
use super::vocab::ConditionStatus;
use crate::fleet::{self, FleetParams};
use crate::render::index::Index;
use crate::render::{InputKind, InputRef, NodeInfo};
use crate::types::Timestamp;
use netwave_api::vocab::kstatus;

/// Findings listed in a condition message before "and N more": a status must stay small.
const MESSAGE_FINDINGS: usize = 5;

/// What fleet validation says about one object, and what it resolves to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectVerdict {
    /// Errors that name this object (its own fields, or a clash with or reference to another one).
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    /// Nodes its selector matches (0 for an invalid selector).
    pub selected_nodes: u32,
    /// VRFs: the table, explicit or allocated.
    pub table_id: Option<u32>,
    /// MirrorTargets: the MirrorSelectors that name it (`activeSelectors`); its node count is
    /// `selected_nodes` (also written as `activeNodes`).
    pub active_selectors: Option<u32>,
}

/// Every input object's verdict, by object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InputVerdicts {
    pub objects: BTreeMap<InputRef, ObjectVerdict>,
}

impl InputVerdicts {
    pub fn get(&self, kind: InputKind, name: &str) -> Option<&ObjectVerdict> {
        self.objects.get(&InputRef::new(kind, name))
    }
}

/// Validates the inputs against the nodes and attributes every finding to the objects it names.
/// Findings that name no object (a rendered config the agent's model refuses, no nodes at all) are the
/// revision's; [`input_status`] takes them from the revision's validation.
pub fn input_verdicts(
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
    params: &FleetParams,
) -> InputVerdicts {
    let ix = Index::build(inputs, nodes);
    let count = |sel: Option<u32>| -> u32 {
        ix.groups
            .iter()
            .filter(|g| g.has(sel))
            .map(|g| g.nodes.len() as u32)
            .sum()
    };
    let mut objects: BTreeMap<InputRef, ObjectVerdict> = BTreeMap::new();
    for (i, v) in ix.vrfs.iter().enumerate() {
        objects.insert(
            InputRef::new(InputKind::Vrf, &v.name),
            ObjectVerdict {
                selected_nodes: count(ix.vrf_sel[i]),
                table_id: Some(ix.vrf_tables[i]),
                ..ObjectVerdict::default()
            },
        );
    }
    let selected: [Selected<'_>; 4] = [
        (
            InputKind::Layer2,
            ix.l2s.iter().map(|o| o.name.as_str()).collect(),
            &ix.l2_sel,
        ),
        (
            InputKind::RoutingTable,
            ix.rts.iter().map(|o| o.name.as_str()).collect(),
            &ix.rt_sel,
        ),
        (
            InputKind::BgpPeering,
            ix.peerings.iter().map(|o| o.name.as_str()).collect(),
            &ix.peering_sel,
        ),
        (
            InputKind::Underlay,
            ix.underlays.iter().map(|o| o.name.as_str()).collect(),
            &ix.underlay_sel,
        ),
    ];
    for (kind, names, sels) in selected {
        for (name, &sel) in names.into_iter().zip(sels) {
            objects.insert(
                InputRef::new(kind, name),
                ObjectVerdict {
                    selected_nodes: count(sel),
                    ..ObjectVerdict::default()
                },
            );
        }
    }
    mirror_verdicts(&ix, &mut objects);
    let checked = fleet::validate(inputs, nodes, params);
    for (findings, errors) in [(&checked.errors, true), (&checked.warnings, false)] {
        for f in findings {
            for o in &f.objects {
                if let Some(v) = objects.get_mut(o) {
                    let list = if errors {
                        &mut v.errors
                    } else {
                        &mut v.warnings
                    };
                    list.push(f.to_string());
                }
            }
        }
    }
    InputVerdicts { objects }
}

/// A kind whose objects each have a selector: its object names and their selectors (parallel).
type Selected<'a> = (InputKind, Vec<&'a str>, &'a [Option<u32>]);

/// Mirrors have no selector: a MirrorSelector is on the nodes that have its source and its target's
/// VRF, a MirrorTarget on the nodes of its selectors.
fn mirror_verdicts(ix: &Index<'_>, objects: &mut BTreeMap<InputRef, ObjectVerdict>) {
    let placements = crate::render::mirror::placements(ix);
    let nodes_in = |groups: &std::collections::BTreeSet<usize>| -> u32 {
        groups
            .iter()
            .map(|&g| ix.groups[g].nodes.len() as u32)
            .sum()
    };
    let mut target_groups: Vec<std::collections::BTreeSet<usize>> =
        vec![Default::default(); ix.mirror_targets.len()];
    for (i, o) in ix.mirror_selectors.iter().enumerate() {
        let groups: std::collections::BTreeSet<usize> = placements[i]
            .as_ref()
            .map(|(r, gs)| {
                target_groups[r.target].extend(gs);
                gs.iter().copied().collect()
            })
            .unwrap_or_default();
        objects.insert(
            InputRef::new(InputKind::MirrorSelector, &o.name),
            ObjectVerdict {
                selected_nodes: nodes_in(&groups),
                ..ObjectVerdict::default()
            },
        );
    }
    for (i, o) in ix.mirror_targets.iter().enumerate() {
        let selectors = ix
            .mirror_selectors
            .iter()
            .filter(|s| {
                s.spec.mirror_target.name == o.name && s.spec.mirror_target.kind == "MirrorTarget"
            })
            .count() as u32;
        objects.insert(
            InputRef::new(InputKind::MirrorTarget, &o.name),
            ObjectVerdict {
                selected_nodes: nodes_in(&target_groups[i]),
                active_selectors: Some(selectors),
                ..ObjectVerdict::default()
            },
        );
    }
}

/// `a; b; c and 4 more`.
fn listed(items: &[String]) -> String {
    let mut s = items
        .iter()
        .take(MESSAGE_FINDINGS)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if items.len() > MESSAGE_FINDINGS {
        s.push_str(&format!(" and {} more", items.len() - MESSAGE_FINDINGS));
    }
    s
}

/// The status one object should carry: `verdict` from [`input_verdicts`] of the current inputs, which
/// `revision` was cut from and whose fleet validation reported `revision_errors` (all of them, also the
/// ones that name no object). `old` is the stored status: its `lastTransitionTime` is kept while
/// `Accepted` keeps its status.
///
/// `health` is that revision's rollout ([`health::of_revision`] of its status as stored): the object
/// is `Ready` once the revision that carries it is `Complete`, `Reconciling` while it rolls out,
/// `Stalled` when it failed or is held (and whenever the object is not accepted).
pub fn input_status(
    verdict: &ObjectVerdict,
    revision: &str,
    revision_errors: &[String],
    health: &Verdict,
    generation: Option<i64>,
    old: Option<&InputStatus>,
    now: Timestamp,
) -> InputStatus {
    let (status, reason, message) = if !verdict.errors.is_empty() {
        (
            ConditionStatus::False,
            accepted_reasons::INVALID,
            format!(
                "{} error(s); no node gets {revision} until they are fixed: {}",
                verdict.errors.len(),
                listed(&verdict.errors)
            ),
        )
    } else if !revision_errors.is_empty() {
        (
            ConditionStatus::False,
            accepted_reasons::REVISION_INVALID,
            format!(
                "no problem with this object, but {revision} fails fleet validation elsewhere, so no \
                 node gets it: {}",
                listed(revision_errors)
            ),
        )
    } else if !verdict.warnings.is_empty() {
        (
            ConditionStatus::True,
            accepted_reasons::VALID,
            format!(
                "in {revision}; {} warning(s): {}",
                verdict.warnings.len(),
                listed(&verdict.warnings)
            ),
        )
    } else {
        (
            ConditionStatus::True,
            accepted_reasons::VALID,
            format!("in {revision}; fleet validation finds no problem"),
        )
    };
    accepted(
        (status, reason, message),
        verdict,
        (Some(revision), &health::for_input(health, revision)),
        generation,
        old,
        now,
    )
}

/// The status one object should carry while the current inputs cannot become a revision at all:
/// `problem` says why (e.g. [`crate::limits::InputsTooLarge`]). Not accepted: `Invalid` with its own
/// errors when it has any (as [`input_status`]), else `RevisionInvalid` with the problem; `revision`
/// is left out, since none was cut from these inputs.
pub fn input_status_uncut(
    verdict: &ObjectVerdict,
    problem: &str,
    generation: Option<i64>,
    old: Option<&InputStatus>,
    now: Timestamp,
) -> InputStatus {
    let (reason, message) = if verdict.errors.is_empty() {
        (
            accepted_reasons::REVISION_INVALID,
            format!("no problem with this object alone, but {problem}"),
        )
    } else {
        (
            accepted_reasons::INVALID,
            format!(
                "{} error(s), and {problem}: {}",
                verdict.errors.len(),
                listed(&verdict.errors)
            ),
        )
    };
    let stalled = Verdict {
        health: Health::Stalled,
        reason: kstatus::INPUTS_NOT_CUT,
        message: problem.to_string(),
    };
    accepted(
        (ConditionStatus::False, reason, message),
        verdict,
        (None, &stalled),
        generation,
        old,
        now,
    )
}

/// The status with this `Accepted` condition and the kstatus ones of `health` (of the object itself
/// when it is not accepted); `lastTransitionTime` stays `old`'s while a condition's status does.
fn accepted(
    (status, reason, message): (ConditionStatus, &'static str, String),
    verdict: &ObjectVerdict,
    (revision, health): (Option<&str>, &Verdict),
    generation: Option<i64>,
    old: Option<&InputStatus>,
    now: Timestamp,
) -> InputStatus {
    let previous = old.and_then(InputStatus::accepted);
    let last_transition_time = match previous {
        Some(c) if c.status == status.as_str() => c.last_transition_time.clone(),
        _ => now.truncate_to_secs().to_time(),
    };
    let refused;
    let health = if status == ConditionStatus::False && health.health != Health::Stalled {
        refused = Verdict {
            health: Health::Stalled,
            reason,
            message: message.clone(),
        };
        &refused
    } else {
        health
    };
    let old_conditions = old.map_or(&[][..], |o| &o.conditions[..]);
    let mut conditions = vec![Condition {
        last_transition_time,
        message,
        observed_generation: generation,
        reason: reason.to_string(),
        status: status.as_str().to_string(),
        type_: ACCEPTED.to_string(),
    }];
    conditions.extend(health::conditions(health, old_conditions, generation, now));
    InputStatus {
        conditions,
        selected_nodes: Some(verdict.selected_nodes),
        table_id: verdict.table_id,
        active_selectors: verdict.active_selectors,
        active_nodes: verdict.active_selectors.map(|_| verdict.selected_nodes),
        revision: revision.map(str::to_string),
        observed_generation: generation,
    }
}

#[cfg(test)]
mod tests {
    use netwave_api::vocab::{ConditionStatus, accepted_reasons};
    use netwave_api::{
        Layer2NetworkConfigurationSpec, NamedLayer2, NamedVrf, VRFRouteConfigurationSpec,
    };

    use super::*;

    fn vrf(name: &str, vni: u32, table: Option<u32>, import: &str) -> NamedVrf {
        let mut spec: VRFRouteConfigurationSpec = serde_json::from_value(serde_json::json!({
            "vrf": name, "seq": 1, "vni": vni,
            "import": [{"cidr": import, "action": "permit"}],
        }))
        .unwrap();
        spec.table_id = table;
        NamedVrf {
            name: name.into(),
            spec,
        }
    }

    fn l2(name: &str, vlan: u16, vrf: Option<&str>, pool: Option<&str>) -> NamedLayer2 {
        let mut v = serde_json::json!({"id": vlan, "vni": 100 + vlan as u32, "mtu": 1500});
        if let Some(vrf) = vrf {
            v["vrf"] = vrf.into();
        }
        if let Some(pool) = pool {
            v["nodeSelector"] = serde_json::json!({"matchLabels": {"pool": pool}});
        }
        let spec: Layer2NetworkConfigurationSpec = serde_json::from_value(v).unwrap();
        NamedLayer2 {
            name: name.into(),
            spec,
        }
    }

    fn nodes() -> Vec<NodeInfo> {
        (0..5)
            .map(|i| {
                let pool = if i < 2 { "edge" } else { "compute" };
                NodeInfo::new(format!("n{i}"), [("pool", pool)])
            })
            .collect()
    }

    fn inputs() -> RevisionInputs {
        RevisionInputs {
            bgp_peerings: Vec::new(),
            mirror_targets: Vec::new(),
            mirror_selectors: Vec::new(),
            underlays: Vec::new(),
            render_version: None,
            vrfs: vec![
                vrf("tenant-a", 1001, None, "10.0.76.80/28"),
                vrf("tenant-b", 1002, Some(200), "10.0.76.81/28"),
            ],
            layer2s: vec![
                l2("edge-100", 100, Some("tenant-a"), Some("edge")),
                l2("orphan-101", 101, Some("tenant-zz"), None),
            ],
            routing_tables: Vec::new(),
        }
    }

    /// Table test: each object's own verdict, with the field path, the nodes it selects and its table.
    #[test]
    fn each_object_gets_its_own_verdict_nodes_and_table() {
        let v = input_verdicts(&inputs(), &nodes(), &FleetParams::default());
        let a = v.get(InputKind::Vrf, "tenant-a").unwrap();
        assert_eq!(a.errors, Vec::<String>::new());
        assert_eq!(a.selected_nodes, 5);
        let table = a.table_id.unwrap();
        assert!(
            (crate::render::TABLE_ALLOC_BASE..crate::render::TABLE_ALLOC_BASE * 2).contains(&table),
            "allocated from the range: {table}"
        );
        let b = v.get(InputKind::Vrf, "tenant-b").unwrap();
        assert_eq!(b.table_id, Some(200), "explicit table");
        assert_eq!(b.errors.len(), 1, "{:?}", b.errors);
        assert!(
            b.errors[0].contains("spec.import[0].cidr") && b.errors[0].contains("10.0.76.80/28"),
            "names the field and what is right: {}",
            b.errors[0]
        );
        let edge = v.get(InputKind::Layer2, "edge-100").unwrap();
        assert_eq!((edge.selected_nodes, edge.errors.len()), (2, 0));
        let orphan = v.get(InputKind::Layer2, "orphan-101").unwrap();
        assert_eq!(orphan.errors.len(), 1, "{:?}", orphan.errors);
        assert!(
            orphan.errors[0].contains("tenant-zz"),
            "a cross-object error names the missing VRF: {}",
            orphan.errors[0]
        );
    }

    #[test]
    fn accepted_says_why_and_keeps_its_transition_time() {
        let v = input_verdicts(&inputs(), &nodes(), &FleetParams::default());
        let t0 = Timestamp::from_secs(1_000);
        let t1 = Timestamp::from_secs(2_000);
        let errors = vec!["Layer2NetworkConfiguration/orphan-101 …".to_string()];
        let bad = v.get(InputKind::Vrf, "tenant-b").unwrap();
        let rolling = Verdict {
            health: Health::Reconciling,
            reason: "RolloutProgressing",
            message: "1 of 5 node(s) updated".into(),
        };
        let s = input_status(bad, "rev-1", &errors, &rolling, Some(3), None, t0);
        let c = s.accepted().unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (ConditionStatus::False.as_str(), accepted_reasons::INVALID)
        );
        assert!(c.message.contains("spec.import[0].cidr"), "{}", c.message);
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(s.table_id, Some(200));
        assert_eq!(s.selected_nodes, Some(5));
        assert_eq!(s.revision.as_deref(), Some("rev-1"));
        // Not accepted: stalled whatever its revision does, with the same reason.
        let kstatus = |s: &InputStatus| -> Vec<(String, String, String)> {
            (s.conditions.iter().skip(1))
                .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
                .collect()
        };
        let row = |t: &str, st: &str, r: &str| (t.to_string(), st.to_string(), r.to_string());
        let invalid = accepted_reasons::INVALID;
        assert_eq!(
            kstatus(&s),
            [
                row("Ready", "False", invalid),
                row("Reconciling", "False", invalid),
                row("Stalled", "True", invalid)
            ]
        );

        // Fine itself, but the revision fails elsewhere: not accepted, and it says where.
        let good = v.get(InputKind::Vrf, "tenant-a").unwrap();
        let s = input_status(good, "rev-1", &errors, &rolling, Some(1), None, t0);
        let c = s.accepted().unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (
                ConditionStatus::False.as_str(),
                accepted_reasons::REVISION_INVALID
            )
        );
        assert!(c.message.contains("orphan-101"), "{}", c.message);

        // Valid: True. The same verdict later is the same status (no write); a change moves the time.
        let s1 = input_status(good, "rev-2", &[], &rolling, Some(1), None, t0);
        assert_eq!(
            s1.accepted().unwrap().status,
            ConditionStatus::True.as_str()
        );
        let again = input_status(good, "rev-2", &[], &rolling, Some(1), Some(&s1), t1);
        assert_eq!(again, s1, "nothing changed: nothing to write");
        // Accepted: its revision's rollout.
        let progressing = "RolloutProgressing";
        assert_eq!(
            kstatus(&s1),
            [
                row("Ready", "False", progressing),
                row("Reconciling", "True", progressing),
                row("Stalled", "False", progressing)
            ]
        );
        let done = Verdict {
            health: Health::Ready,
            reason: "RolloutComplete",
            message: "all 5 eligible node(s) updated".into(),
        };
        let ready = input_status(good, "rev-2", &[], &done, Some(1), Some(&s1), t1);
        assert_eq!(kstatus(&ready)[0].1, "True");
        assert_eq!(
            ready.conditions[1].message,
            "rev-2 runs on every eligible node"
        );
        // The rollout's progress does not rewrite every input's status.
        let further = Verdict {
            message: "3 of 5 node(s) updated".into(),
            ..rolling.clone()
        };
        let later = input_status(good, "rev-2", &[], &further, Some(1), Some(&s1), t1);
        assert_eq!(later, s1);
        let flipped = input_status(bad, "rev-3", &[], &rolling, Some(2), Some(&s1), t1);
        assert_eq!(
            flipped.accepted().unwrap().last_transition_time,
            t1.to_time()
        );
    }
}
