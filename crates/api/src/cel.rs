//! The per-object rules the API server itself enforces on the input kinds: CEL `x-kubernetes-validations`
//! with Kubernetes' IP/CIDR library (`isCIDR`, `cidr()`, `masked()`, `isIP`; Kubernetes ≥ 1.31), so
//! `kubectl apply` refuses a CIDR with host bits or a reserved table with the field path and a message,
//! instead of answering "created" and failing the next revision.
//!
//! ```text
//!   schemars schema of VRF / L2 / RT ──► with_rules: rules added at these schema paths ──► crds/*.yaml
//!   (rollout kinds and the types they share with the inputs, e.g. PrefixItem inside a revision's
//!    spec.inputs, stay without them: a revision made from an object stored before a rule existed
//!    must still be created, and then fail fleet validation with its status)
//! ```
//!
//! Fleet validation (`netwave-core`) stays the authority: it checks all of this and everything that
//! needs more than one object. These are the rules one object shows on its own and CEL can say; each
//! mirrors a rule of [`crate::validate`] with the same wording. IPv4 broadcast gateways, address-family
//! mixes and a rule's mark with bits outside its mask (CEL has no bitwise operators) are left to fleet
//! validation.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

// Messages are static: the API server estimates the cost of a `messageExpression` that prints a
// CIDR far above its budget, even on bounded strings. The error names the field and its index.

/// A rule on a CIDR network string (`self`): parses, and has no host bits.
fn network() -> Vec<Value> {
    vec![
        json!({
            "rule": "isCIDR(self)",
            "message": "must be a network in CIDR notation (e.g. 10.0.0.0/24 or fd00::/64)",
            "reason": "FieldValueInvalid",
        }),
        json!({
            "rule": "!isCIDR(self) || cidr(self) == cidr(self).masked()",
            "message": "must be a network address, with no host bits set (e.g. 10.0.76.80/28, not 10.0.76.81/28)",
            "reason": "FieldValueInvalid",
        }),
    ]
}

/// An interface address with prefix length that is a host inside its prefix, not the network address
/// (`/31`, `/32`, `/127`, `/128` have none to avoid).
fn host_address() -> Vec<Value> {
    vec![
        json!({
            "rule": "isCIDR(self)",
            "message": "must be an address with prefix length (e.g. 10.250.0.1/24)",
            "reason": "FieldValueInvalid",
        }),
        json!({
            "rule": "!isCIDR(self) || !(cidr(self) == cidr(self).masked()) || cidr(self).prefixLength() >= (self.contains(':') ? 127 : 31)",
            "message": "must be a host address inside its prefix, not the network address (e.g. 10.250.0.1/24, not 10.250.0.0/24)",
            "reason": "FieldValueInvalid",
        }),
    ]
}

fn ip_address() -> Vec<Value> {
    vec![json!({
        "rule": "isIP(self)",
        "message": "must be an IP address (e.g. 10.0.0.1 or fd00::1)",
        "reason": "FieldValueInvalid",
    })]
}

/// `crate::validate::RESERVED_TABLES` (0 is below the schema's minimum already).
fn table_id() -> Vec<Value> {
    vec![json!({
        "rule": "!(self in [253, 254, 255])",
        "message": "tables 253, 254 and 255 are reserved for the kernel's default/main/local tables",
        "reason": "FieldValueInvalid",
    })]
}

/// `ge` and `le` of a prefix-list item: within the prefix length of its cidr and the family's longest
/// prefix, and `ge <= le`.
fn prefix_item() -> Vec<Value> {
    let bound = |f: &str| {
        json!({
            "rule": format!(
                "!has(self.{f}) || !isCIDR(self.cidr) || (self.{f} >= cidr(self.cidr).prefixLength() \
                 && self.{f} <= (self.cidr.contains(':') ? 128 : 32))"
            ),
            "message": format!(
                "{f} must be from the prefix length of cidr to 32 (IPv4) or 128 (IPv6)"
            ),
            "fieldPath": format!(".{f}"),
            "reason": "FieldValueInvalid",
        })
    };
    vec![
        bound("ge"),
        bound("le"),
        json!({
            "rule": "!has(self.ge) || !has(self.le) || self.ge <= self.le",
            "message": "ge must not be greater than le",
            "fieldPath": ".ge",
            "reason": "FieldValueInvalid",
        }),
    ]
}

fn rule_priority() -> Vec<Value> {
    vec![json!({
        "rule": "!(self in [32766, 32767])",
        "message": "priorities 32766 and 32767 belong to the kernel's main/default rules",
        "reason": "FieldValueInvalid",
    })]
}

/// A policy rule's firewall mark and mask ([`crate::validate::check_fwmark`], but for a mark with bits
/// outside its mask: CEL has no bitwise operators, fleet validation says that one).
fn rule_fwmark() -> Vec<Value> {
    use crate::validate::{FWMARK_ZERO_WITHOUT_FWMASK, FWMASK_WITHOUT_FWMARK, FWMASK_ZERO};
    vec![
        json!({
            "rule": "!has(self.fwmask) || has(self.fwmark)",
            "message": FWMASK_WITHOUT_FWMARK,
            "fieldPath": ".fwmask",
            "reason": "FieldValueInvalid",
        }),
        json!({
            "rule": "!has(self.fwmask) || self.fwmask != 0",
            "message": FWMASK_ZERO,
            "fieldPath": ".fwmask",
            "reason": "FieldValueInvalid",
        }),
        json!({
            "rule": "!has(self.fwmark) || self.fwmark != 0 || has(self.fwmask)",
            "message": FWMARK_ZERO_WITHOUT_FWMASK,
            "fieldPath": ".fwmark",
            "reason": "FieldValueInvalid",
        }),
    ]
}

fn anycast_mac_with_gateways() -> Vec<Value> {
    vec![json!({
        "rule": "!has(self.anycastGateways) || size(self.anycastGateways) == 0 || has(self.anycastMac)",
        "message": "required when anycastGateways are set: every node must answer with the same MAC",
        "fieldPath": ".anycastMac",
        "reason": "FieldValueRequired",
    })]
}

/// A BGPPeering peers over a segment or with workload addresses, never both, never neither.
fn one_peering_kind() -> Vec<Value> {
    vec![json!({
        "rule": "has(self.peeringVlan) != has(self.loopbackPeer)",
        "message": "exactly one of peeringVlan (a layer-2 segment to listen on) or loopbackPeer (workload addresses) is required",
        "reason": "FieldValueInvalid",
    })]
}

/// An underlay neighbour is numbered or unnumbered ([`crate::validate::validate_underlay`] says the
/// same).
fn one_underlay_peer() -> Vec<Value> {
    vec![json!({
        "rule": "has(self.address) != has(self.interface)",
        "message": "exactly one of address (a numbered session) or interface (unnumbered) is required",
        "reason": "FieldValueInvalid",
    })]
}

/// An IPv4 address: the underlay sessions carry the IPv4 VTEP routes.
fn ipv4_address() -> Vec<Value> {
    vec![json!({
        "rule": "isIP(self) && ip(self).family() == 4",
        "message": "must be an IPv4 address (e.g. 198.18.0.254); use interface for a session over IPv6 link-local",
        "reason": "FieldValueInvalid",
    })]
}

/// A hold time is 0 (none) or at least 3 seconds, and no shorter than the keepalive.
fn hold_time() -> Vec<Value> {
    vec![json!({
        "rule": "self.hold == 0 || (self.hold >= 3 && self.keepalive <= self.hold)",
        "message": "hold must be 0 (no hold timer) or at least 3 seconds and at least keepalive",
        "reason": "FieldValueInvalid",
    })]
}

/// A mirror reference names an object of netwave's group (or das-schiff's, for their manifests) of
/// one of `kinds`; [`crate::validate::validate_mirror_selector`] says the same.
fn mirror_ref(kinds: &[&str]) -> Vec<Value> {
    let list = kinds
        .iter()
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        json!({
            "rule": format!("self.kind in [{list}]"),
            "message": format!("kind must be one of {}", kinds.join(", ")),
            "fieldPath": ".kind",
            "reason": "FieldValueInvalid",
        }),
        json!({
            "rule": "!has(self.apiGroup) || self.apiGroup in ['', 'netwave.dev', 'network.t-caas.telekom.com']",
            "message": "apiGroup must be netwave.dev (or das-schiff's network.t-caas.telekom.com), or omitted",
            "fieldPath": ".apiGroup",
            "reason": "FieldValueInvalid",
        }),
        json!({
            "rule": "!has(self.namespace) || self.namespace == ''",
            "message": "netwave's objects are cluster-scoped: omit the namespace",
            "fieldPath": ".namespace",
            "reason": "FieldValueForbidden",
        }),
    ]
}

/// Ports match only TCP, UDP and SCTP.
fn ports_need_protocol() -> Vec<Value> {
    vec![json!({
        "rule": "!has(self.protocol) || !(self.protocol.lowerAscii() in ['icmp', 'icmpv6']) || (!has(self.srcPort) && !has(self.dstPort))",
        "message": "ports match only tcp, udp or sctp; an ICMP packet has none",
        "fieldPath": ".protocol",
        "reason": "FieldValueInvalid",
    })]
}

fn mirror_protocol() -> Vec<Value> {
    vec![json!({
        "rule": "self.lowerAscii() in ['tcp', 'udp', 'sctp', 'icmp', 'icmpv6']",
        "message": "must be tcp, udp, sctp, icmp or icmpv6",
        "reason": "FieldValueInvalid",
    })]
}

/// (kind, path of property names under `spec`, where `[]` means the list's items, rules).
fn rules() -> Vec<(&'static str, &'static [&'static str], Vec<Value>)> {
    vec![
        ("VRFRouteConfiguration", &["tableId"], table_id()),
        ("VRFRouteConfiguration", &["import", "[]"], prefix_item()),
        (
            "VRFRouteConfiguration",
            &["import", "[]", "cidr"],
            network(),
        ),
        ("VRFRouteConfiguration", &["export", "[]"], prefix_item()),
        (
            "VRFRouteConfiguration",
            &["export", "[]", "cidr"],
            network(),
        ),
        ("VRFRouteConfiguration", &["aggregate", "[]"], network()),
        (
            "Layer2NetworkConfiguration",
            &[],
            anycast_mac_with_gateways(),
        ),
        (
            "Layer2NetworkConfiguration",
            &["anycastGateways", "[]"],
            host_address(),
        ),
        ("RoutingTable", &["tableId"], table_id()),
        ("RoutingTable", &["routes", "[]", "prefix"], network()),
        ("RoutingTable", &["routes", "[]", "via"], ip_address()),
        ("RoutingTable", &["rules", "[]", "from"], network()),
        ("RoutingTable", &["rules", "[]", "to"], network()),
        ("RoutingTable", &["rules", "[]"], rule_fwmark()),
        (
            "RoutingTable",
            &["rules", "[]", "priority"],
            rule_priority(),
        ),
        ("BGPPeering", &[], one_peering_kind()),
        ("BGPPeering", &["import", "[]"], prefix_item()),
        ("BGPPeering", &["import", "[]", "cidr"], network()),
        ("BGPPeering", &["export", "[]"], prefix_item()),
        ("BGPPeering", &["export", "[]", "cidr"], network()),
        ("BGPPeering", &["loopbackPeer", "ips", "[]"], ip_address()),
        ("MirrorTarget", &["destinationIP"], ip_address()),
        ("Underlay", &["neighbors", "[]"], one_underlay_peer()),
        ("Underlay", &["neighbors", "[]", "address"], ipv4_address()),
        ("Underlay", &["timers"], hold_time()),
        (
            "MirrorSelector",
            &["mirrorTarget"],
            mirror_ref(&["MirrorTarget"]),
        ),
        (
            "MirrorSelector",
            &["mirrorSource"],
            mirror_ref(&crate::validate::MIRROR_SOURCE_KINDS),
        ),
        ("MirrorSelector", &["trafficMatch"], ports_need_protocol()),
        (
            "MirrorSelector",
            &["trafficMatch", "protocol"],
            mirror_protocol(),
        ),
    ]
}

/// The API server refuses a CRD whose rules could cost too much on the largest object it would accept,
/// so every list and string a rule walks gets a bound: (kind, path as in [`rules`], keyword, value).
/// Generous for real fabrics (a RoutingTable of 10,000 routes, 2,048 prefix-list items); an address in
/// any notation fits in 64 characters.
fn bounds() -> Vec<(&'static str, &'static [&'static str], &'static str, u32)> {
    const ADDR: u32 = 64;
    vec![
        ("VRFRouteConfiguration", &["import"], "maxItems", 2048),
        (
            "VRFRouteConfiguration",
            &["import", "[]", "cidr"],
            "maxLength",
            ADDR,
        ),
        ("VRFRouteConfiguration", &["export"], "maxItems", 2048),
        (
            "VRFRouteConfiguration",
            &["export", "[]", "cidr"],
            "maxLength",
            ADDR,
        ),
        ("VRFRouteConfiguration", &["aggregate"], "maxItems", 1024),
        (
            "VRFRouteConfiguration",
            &["aggregate", "[]"],
            "maxLength",
            ADDR,
        ),
        (
            "Layer2NetworkConfiguration",
            &["anycastGateways"],
            "maxItems",
            64,
        ),
        (
            "Layer2NetworkConfiguration",
            &["anycastGateways", "[]"],
            "maxLength",
            ADDR,
        ),
        ("RoutingTable", &["routes"], "maxItems", 10000),
        (
            "RoutingTable",
            &["routes", "[]", "prefix"],
            "maxLength",
            ADDR,
        ),
        ("RoutingTable", &["routes", "[]", "via"], "maxLength", ADDR),
        ("RoutingTable", &["rules"], "maxItems", 10000),
        ("RoutingTable", &["rules", "[]", "from"], "maxLength", ADDR),
        ("RoutingTable", &["rules", "[]", "to"], "maxLength", ADDR),
        ("BGPPeering", &["import"], "maxItems", 2048),
        ("BGPPeering", &["import", "[]", "cidr"], "maxLength", ADDR),
        ("BGPPeering", &["export"], "maxItems", 2048),
        ("BGPPeering", &["export", "[]", "cidr"], "maxLength", ADDR),
        ("BGPPeering", &["loopbackPeer", "ips"], "maxItems", 2),
        ("MirrorTarget", &["destinationIP"], "maxLength", ADDR),
        (
            "Underlay",
            &["neighbors", "[]", "address"],
            "maxLength",
            ADDR,
        ),
        (
            "MirrorSelector",
            &["trafficMatch", "srcPrefix"],
            "maxLength",
            ADDR,
        ),
        (
            "MirrorSelector",
            &["trafficMatch", "dstPrefix"],
            "maxLength",
            ADDR,
        ),
        (
            "MirrorSelector",
            &["mirrorTarget", "apiGroup"],
            "maxLength",
            253,
        ),
        (
            "MirrorSelector",
            &["mirrorSource", "apiGroup"],
            "maxLength",
            253,
        ),
        (
            "MirrorSelector",
            &["mirrorTarget", "namespace"],
            "maxLength",
            63,
        ),
        (
            "MirrorSelector",
            &["mirrorSource", "namespace"],
            "maxLength",
            63,
        ),
        (
            "BGPPeering",
            &["loopbackPeer", "ips", "[]"],
            "maxLength",
            ADDR,
        ),
    ]
}

/// The schema of the CRD's `spec` at `path` (`[]`: a list's items).
fn at<'v>(
    version: &'v mut Value,
    kind: &str,
    path: &[&str],
) -> &'v mut serde_json::Map<String, Value> {
    let mut at = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    for p in path {
        at = if *p == "[]" {
            &mut at["items"]
        } else {
            &mut at["properties"][*p]
        };
    }
    at.as_object_mut()
        .unwrap_or_else(|| panic!("{kind}: no schema at spec.{}", path.join(".")))
}

/// Adds the input kinds' CEL rules, bounds and defaults to their CRD; other CRDs come back unchanged.
pub fn with_rules(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let kind = crd.spec.names.kind.clone();
    let mut v = serde_json::to_value(crd).expect("a CRD always serializes");
    let versions = v["spec"]["versions"]
        .as_array_mut()
        .expect("a CRD has versions");
    for version in versions {
        for (k, path, key, value) in bounds() {
            if k == kind {
                at(version, &kind, path).insert(key.into(), value.into());
            }
        }
        for (k, path, value) in crate::defaults::defaults() {
            if k == kind {
                let schema = at(version, &kind, path);
                schema.insert("default".into(), value);
                // An explicit null is pruned and defaulted too, not kept as "no limit".
                schema.remove("nullable");
            }
        }
        for (k, path, rules) in rules() {
            if k != kind {
                continue;
            }
            at(version, &kind, path)
                .entry("x-kubernetes-validations")
                .or_insert_with(|| json!([]))
                .as_array_mut()
                .expect("x-kubernetes-validations is a list")
                .extend(rules);
        }
    }
    serde_json::from_value(v).expect("only validation rules and defaults were added")
}
