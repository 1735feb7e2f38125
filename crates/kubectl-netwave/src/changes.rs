//! Per-node changes between two renderings of the inputs (`diff REV1 REV2`, and `plan`'s changes against
//! the current target).
//!
//! ```text
//!   inputs A ─┐ core::render::render   node → RenderedNode (configHash)
//!   inputs B ─┤ (against the same Nodes) ──► group nodes by (hash A, hash B) ──► one NodeConfig diff
//!   Nodes ────┘                                                                  per group
//! ```
//!
//! Nodes whose config changes the same way form one group, so a change to 5,000 nodes is one entry with
//! a count, not 5,000. The diff is over the rendered [`NodeConfig`]: VRFs by name, layer-2 segments by
//! VLAN, routes by (table, prefix, metric), rules by all their fields; a changed object lists the fields
//! that differ (`mtu 9000 → 1500`).

use std::collections::BTreeMap;

use kube::Client;
use netwave_api::{Layer2Config, NodeConfig, RevisionInputs, RouteConfig, RuleConfig, VrfConfig};
use netwave_core::render::{NodeInfo, RenderedNode, render};
use serde::Serialize;
use serde_json::Value;

use crate::cli::DiffArgs;
use crate::cluster::{self, name};
use crate::output::{emit, names};
use crate::shared::{Exit, Term};

/// Node names listed per group before "and N more".
pub const GROUP_NODES: usize = 5;

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeChanges {
    /// Nodes rendered (the current Nodes).
    pub nodes: usize,
    /// Nodes whose config changes.
    pub changed: usize,
    /// Groups of nodes with the same change, most nodes first.
    pub groups: Vec<ChangeGroup>,
    /// Groups beyond those listed.
    pub groups_not_shown: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeGroup {
    pub count: usize,
    /// The first [`GROUP_NODES`] nodes.
    pub nodes: Vec<String>,
    /// `+ …` added, `- …` removed, `~ …: field a → b` changed.
    pub changes: Vec<String>,
}

/// Nodes with one (before, after) config pair, and those configs.
type Group<'a> = (
    Vec<String>,
    Option<&'a RenderedNode>,
    Option<&'a RenderedNode>,
);

/// Groups the nodes whose rendered config differs between `before` and `after` (a node missing from
/// one side has an empty config there). Pure.
pub fn node_changes(
    before: &BTreeMap<String, RenderedNode>,
    after: &BTreeMap<String, RenderedNode>,
    max_groups: usize,
) -> NodeChanges {
    let empty = netwave_core::render::config_hash(&NodeConfig::default());
    let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
    let mut all: Vec<&String> = before.keys().chain(after.keys()).collect();
    all.sort();
    all.dedup();
    for node in &all {
        let (b, a) = (before.get(*node), after.get(*node));
        let hb = b.map_or(empty.clone(), |r| r.config_hash.clone());
        let ha = a.map_or(empty.clone(), |r| r.config_hash.clone());
        if hb == ha {
            continue;
        }
        let g = groups.entry((hb, ha)).or_insert((Vec::new(), b, a));
        g.0.push((*node).clone());
    }
    let changed = groups.values().map(|g| g.0.len()).sum();
    let mut list: Vec<_> = groups.into_values().collect();
    list.sort_by(|x, y| y.0.len().cmp(&x.0.len()).then_with(|| x.0.cmp(&y.0)));
    let groups_not_shown = list.len().saturating_sub(max_groups);
    let groups = list
        .into_iter()
        .take(max_groups)
        .map(|(nodes, b, a)| {
            let cb = b.map(RenderedNode::config).unwrap_or_default();
            let ca = a.map(RenderedNode::config).unwrap_or_default();
            ChangeGroup {
                count: nodes.len(),
                nodes: nodes.into_iter().take(GROUP_NODES).collect(),
                changes: config_diff(&cb, &ca),
            }
        })
        .collect();
    NodeChanges {
        nodes: all.len(),
        changed,
        groups,
        groups_not_shown,
    }
}

/// The differences between two node configs, one line each.
pub fn config_diff(before: &NodeConfig, after: &NodeConfig) -> Vec<String> {
    let mut out = Vec::new();
    keyed(&mut out, &before.vrfs, &after.vrfs, |v: &VrfConfig| {
        format!("vrf {}", v.name)
    });
    keyed(
        &mut out,
        &before.layer2s,
        &after.layer2s,
        |l: &Layer2Config| format!("layer2 vlan {}", l.vlan),
    );
    keyed(
        &mut out,
        &before.routes,
        &after.routes,
        |r: &RouteConfig| {
            let mut k = format!("route table {} {}", r.table, r.prefix);
            if let Some(m) = r.metric {
                k.push_str(&format!(" metric {m}"));
            }
            k
        },
    );
    keyed(&mut out, &before.rules, &after.rules, |r: &RuleConfig| {
        let mut k = format!("rule priority {} table {}", r.priority, r.table);
        for (what, v) in [("from", &r.from), ("to", &r.to), ("iif", &r.iif)] {
            if let Some(v) = v {
                k.push_str(&format!(" {what} {v}"));
            }
        }
        if let Some(m) = r.fwmark {
            k.push_str(&format!(" fwmark {m:#x}"));
        }
        if let Some(m) = r.fwmask {
            k.push_str(&format!("/{m:#x}"));
        }
        k
    });
    keyed(&mut out, &before.bgp_peers, &after.bgp_peers, |p| {
        format!("bgp-peering {}", p.name)
    });
    keyed(
        &mut out,
        &before.mirror_tunnels,
        &after.mirror_tunnels,
        |t| format!("mirror-tunnel {}", t.name),
    );
    keyed(&mut out, &before.mirrors, &after.mirrors, |m| {
        format!("mirror {}", m.name)
    });
    // The node's effective underlay: an Underlay input's, or the agent's bootstrap when none.
    keyed(
        &mut out,
        before.underlay.as_slice(),
        after.underlay.as_slice(),
        |u| format!("underlay {}", u.name),
    );
    out
}

fn keyed<T: Serialize>(
    out: &mut Vec<String>,
    before: &[T],
    after: &[T],
    key: impl Fn(&T) -> String,
) {
    let b: BTreeMap<String, Value> = before.iter().map(|x| (key(x), json(x))).collect();
    let a: BTreeMap<String, Value> = after.iter().map(|x| (key(x), json(x))).collect();
    for (k, vb) in &b {
        match a.get(k) {
            None => out.push(format!("- {k}")),
            Some(va) if va != vb => out.push(format!("~ {k}: {}", spec_fields(vb, va))),
            Some(_) => {}
        }
    }
    for (k, va) in &a {
        if !b.contains_key(k) {
            out.push(format!("+ {k} {}", compact(va)));
        }
    }
}

fn json<T: Serialize>(x: &T) -> Value {
    serde_json::to_value(x).expect("netwave API types always serialize")
}

/// `mtu 9000 → 1500, anycastGateways [..] → [..]`.
pub fn spec_fields(before: &Value, after: &Value) -> String {
    let (Value::Object(b), Value::Object(a)) = (before, after) else {
        return format!("{} → {}", compact(before), compact(after));
    };
    let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| b.get(*k) != a.get(*k))
        .map(|k| {
            let show = |v: Option<&Value>| v.map_or("(none)".to_string(), value);
            format!("{k} {} → {}", show(b.get(k)), show(a.get(k)))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// An added object in one line: `(device blue, table 100, vni 1000, …)`, empty lists left out.
fn compact(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .filter(|(_, v)| !matches!(v, Value::Array(a) if a.is_empty()) && !v.is_null())
                .map(|(k, v)| format!("{k} {}", value(v)))
                .collect();
            format!("({})", parts.join(", "))
        }
        other => value(other),
    }
}

pub fn render_changes(c: &NodeChanges, s: &mut String) {
    if c.changed == 0 {
        s.push_str(&format!("no node's config changes ({} nodes)\n", c.nodes));
        return;
    }
    s.push_str(&format!(
        "{} of {} nodes change ({} distinct change{}):\n",
        c.changed,
        c.nodes,
        c.groups.len() + c.groups_not_shown,
        if c.groups.len() + c.groups_not_shown == 1 {
            ""
        } else {
            "s"
        }
    ));
    for g in &c.groups {
        s.push_str(&format!(
            "  {} node{}: {}\n",
            g.count,
            if g.count == 1 { "" } else { "s" },
            names(&g.nodes, g.count)
        ));
        for line in &g.changes {
            s.push_str(&format!("    {line}\n"));
        }
    }
    if c.groups_not_shown > 0 {
        s.push_str(&format!(
            "  and {} more groups (--max-groups shows more)\n",
            c.groups_not_shown
        ));
    }
}

/// Renders inputs for the nodes; an invalid selector is an error naming the object.
pub fn render_for(
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
    what: &str,
) -> anyhow::Result<BTreeMap<String, RenderedNode>> {
    render(inputs, nodes).map_err(|e| anyhow::anyhow!("cannot render {what}: {e}"))
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffView {
    pub from: String,
    pub to: String,
    #[serde(flatten)]
    pub changes: NodeChanges,
}

pub async fn run(client: &Client, args: DiffArgs, term: &mut Term<'_>) -> anyhow::Result<Exit> {
    let revs = cluster::revisions(client).await?;
    let from = cluster::resolve(&revs, &args.from)?;
    let to = cluster::resolve(&revs, &args.to)?;
    let nodes = cluster::node_infos(&cluster::nodes(client).await?);
    let before = render_for(
        &cluster::inputs_of(client, name(from)).await?,
        &nodes,
        name(from),
    )?;
    let after = render_for(
        &cluster::inputs_of(client, name(to)).await?,
        &nodes,
        name(to),
    )?;
    let view = DiffView {
        from: name(from).to_string(),
        to: name(to).to_string(),
        changes: node_changes(&before, &after, args.max_groups),
    };
    emit(term.out, args.output, &view, |v| {
        let mut s = format!(
            "{} (seq {}) → {} (seq {}), rendered for the {} current Nodes\n",
            v.from,
            netwave_api::effective_sequence(from),
            v.to,
            netwave_api::effective_sequence(to),
            v.changes.nodes
        );
        render_changes(&v.changes, &mut s);
        s
    })?;
    Ok(Exit::Success)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(table: u32, prefix: &str) -> RouteConfig {
        serde_json::from_value(serde_json::json!({"table": table, "prefix": prefix})).unwrap()
    }

    #[test]
    fn a_config_diff_names_added_removed_and_changed_fields() {
        let l2 = |vlan: u16, mtu: u32| -> Layer2Config {
            serde_json::from_value(serde_json::json!({
                "vlan": vlan, "vni": 1000 + vlan as u32, "mtu": mtu,
                "bridge": format!("l2.{vlan}"), "vxlan": format!("vx.{vlan}")
            }))
            .unwrap()
        };
        let before = NodeConfig {
            layer2s: vec![l2(100, 9000), l2(101, 1500)],
            routes: vec![rt(300, "10.0.0.0/8")],
            ..Default::default()
        };
        let after = NodeConfig {
            layer2s: vec![l2(100, 1500), l2(102, 9000)],
            ..Default::default()
        };
        assert_eq!(
            config_diff(&before, &after),
            vec![
                "~ layer2 vlan 100: mtu 9000 → 1500",
                "- layer2 vlan 101",
                "+ layer2 vlan 102 (vlan 102, vni 1102, mtu 9000, bridge l2.102, vxlan vx.102, \
                 neighSuppression false)",
                "- route table 300 10.0.0.0/8",
            ]
        );
    }

    #[test]
    fn an_underlay_change_names_the_fields_that_change() {
        let underlay = |asn: u32, neighbor: &str| -> NodeConfig {
            serde_json::from_value(serde_json::json!({"underlay": {
                "name": "fabric", "asn": asn,
                "neighbors": [{"address": neighbor, "remoteAs": "internal"}],
            }}))
            .unwrap()
        };
        assert_eq!(
            config_diff(
                &underlay(65000, "198.18.0.254"),
                &underlay(65010, "198.18.0.253")
            ),
            vec![
                "~ underlay fabric: asn 65000 → 65010, neighbors [{\"address\":\"198.18.0.254\",\"remoteAs\":\"internal\"}] → [{\"address\":\"198.18.0.253\",\"remoteAs\":\"internal\"}]"
            ]
        );
        assert_eq!(
            config_diff(&NodeConfig::default(), &underlay(65000, "198.18.0.254")),
            vec![
                "+ underlay fabric (name fabric, asn 65000, neighbors [{\"address\":\"198.18.0.254\",\"remoteAs\":\"internal\"}])"
            ]
        );
    }

    #[test]
    fn rules_that_differ_in_their_mark_are_two_rules() {
        let rule = |mark: Option<u32>, mask: Option<u32>| -> RuleConfig {
            serde_json::from_value(serde_json::json!({
                "priority": 1000, "table": 300, "fwmark": mark, "fwmask": mask
            }))
            .unwrap()
        };
        let before = NodeConfig {
            rules: vec![rule(Some(0x10), None)],
            ..Default::default()
        };
        let after = NodeConfig {
            rules: vec![rule(Some(0), Some(0xff))],
            ..Default::default()
        };
        assert_eq!(
            config_diff(&before, &after),
            vec![
                "- rule priority 1000 table 300 fwmark 0x10",
                "+ rule priority 1000 table 300 fwmark 0x0/0xff (priority 1000, table 300, fwmark 0, \
                 fwmask 255)",
            ]
        );
    }
}
