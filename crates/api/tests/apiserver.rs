//! netwave's CRDs and samples on the real kube-apiserver, driven by the real kubectl as an admin would:
//! the server accepts the schemas, kubectl explains them, prints their columns, and a bad object is
//! refused by the server with its field path.

use std::path::{Path, PathBuf};
use std::process::Output;

use netwave_control_plane::{ControlPlane, Shared, shared};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kubectl(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut cmd = cp.kubectl();
    cmd.args(args).current_dir(repo());
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl runs");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `kubectl …` that must succeed; returns stdout.
fn ok(cp: &ControlPlane, args: &[&str]) -> String {
    let o = kubectl(cp, args, None);
    let (out, err) = text(&o);
    assert!(o.status.success(), "kubectl {args:?} failed:\n{err}\n{out}");
    out
}

/// `kubectl explain PATH`, waited for: the server publishes a new CRD's OpenAPI schema a moment after
/// the CRD is Established (the OpenAPI controller runs on its own queue), and until then kubectl answers
/// "couldn't find resource". Fails with kubectl's last answer after 30 s.
fn explain(cp: &ControlPlane, path: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let o = kubectl(cp, &["explain", path], None);
        let (out, err) = text(&o);
        if o.status.success() {
            return out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl explain {path} failed for 30 s:\n{err}\n{out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// The control plane with netwave's CRDs applied by kubectl from `crds/` (a kustomization) and
/// Established.
async fn with_crds() -> Shared {
    let cp = shared().await.unwrap();
    let o = kubectl(&cp, &["apply", "-k", "crds/"], None);
    let (out, err) = text(&o);
    assert!(o.status.success(), "kubectl apply -k crds/: {err}");
    // A warning on apply (an unknown schema format, a deprecated field) is a defect users see every time.
    assert!(
        !err.contains("Warning"),
        "the server warns about our CRDs:\n{err}"
    );
    let crds = netwave_api::crds().len();
    assert_eq!(out.lines().count(), crds, "{crds} CRDs: {out}");
    ok(
        &cp,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "crd",
            "-l",
            "",
            "vrfrouteconfigurations.netwave.dev",
            "layer2networkconfigurations.netwave.dev",
            "routingtables.netwave.dev",
            "networkconfigrevisions.netwave.dev",
            "nodenetworkconfigs.netwave.dev",
        ],
    );
    cp
}

#[tokio::test]
async fn crds_are_established_and_kubectl_explains_them() {
    let cp = with_crds().await;
    let out = explain(&cp, "vrf.spec.import");
    assert!(out.contains("KIND:       VRFRouteConfiguration"), "{out}");
    for field in ["cidr", "seq", "ge", "le", "action"] {
        assert!(
            out.lines().any(|l| l.trim_start().starts_with(field)),
            "explain lists {field}:\n{out}"
        );
    }
    assert!(out.contains("enum: permit, deny"), "{out}");
    let out = explain(&cp, "ncr.spec.rollout.maxUnavailable");
    assert!(out.contains("FIELD: maxUnavailable"), "{out}");
    let resources = ok(&cp, &["api-resources", "--api-group=netwave.dev"]);
    for short in ["vrf", "l2", "rt", "ncr", "nnc"] {
        assert!(
            resources.split_whitespace().any(|w| w == short),
            "short name {short} is served:\n{resources}"
        );
    }
}

#[tokio::test]
async fn the_samples_apply_and_print_their_columns() {
    let cp = with_crds().await;
    let out = ok(&cp, &["apply", "-f", "deploy/samples/"]);
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" created")).count(),
        out.lines().count(),
        "{out}"
    );
    let vrfs = ok(&cp, &["get", "vrf"]);
    let header: Vec<&str> = vrfs.lines().next().unwrap().split_whitespace().collect();
    // TABLE, ACCEPTED and NODES come from the status the configurator writes (its tests check them
    // filled); here, with no configurator, they are empty.
    assert_eq!(
        header,
        ["NAME", "VRF", "VNI", "TABLE", "ACCEPTED", "NODES", "AGE"],
        "{vrfs}"
    );
    let l2 = ok(&cp, &["get", "l2", "vlan103-monitoring"]);
    let header: Vec<&str> = l2.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(&header[..5], ["NAME", "VLAN", "VNI", "VRF", "MTU"], "{l2}");
    let described = ok(&cp, &["describe", "vrf", "cluster"]);
    assert!(described.contains("Route Target:"), "{described}");
    // Applying the same files again changes nothing.
    let again = ok(&cp, &["apply", "-f", "deploy/samples/"]);
    assert!(again.lines().all(|l| l.ends_with(" unchanged")), "{again}");
}

/// Schema rules are enforced by the server, with the path of the offending field.
#[tokio::test]
async fn the_server_refuses_a_bad_object_naming_the_field() {
    let cp = with_crds().await;
    let bad_vlan = r#"
apiVersion: netwave.dev/v1alpha1
kind: Layer2NetworkConfiguration
metadata: {name: bad-vlan}
spec: {id: 5000, vni: 100, mtu: 1500}
"#;
    let o = kubectl(&cp, &["apply", "-f", "-"], Some(bad_vlan));
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("spec.id") && err.contains("4094"),
        "names spec.id and its bound: {err}"
    );

    let long_vrf = r#"
apiVersion: netwave.dev/v1alpha1
kind: VRFRouteConfiguration
metadata: {name: long}
spec: {vrf: a-name-far-too-long-for-linux, vni: 100, routeTarget: "65000:1", seq: 1}
"#;
    let o = kubectl(&cp, &["apply", "-f", "-"], Some(long_vrf));
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("spec.vrf"), "{err}");

    // A misspelt field is refused (kubectl's default strict field validation, done by the server).
    let misspelt = r#"
apiVersion: netwave.dev/v1alpha1
kind: RoutingTable
metadata: {name: misspelt}
spec: {tableId: 200, rotes: []}
"#;
    let o = kubectl(&cp, &["apply", "-f", "-"], Some(misspelt));
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains(r#"unknown field "spec.rotes""#), "{err}");

    let o = kubectl(&cp, &["get", "l2,vrf,rt", "-o", "name"], None);
    assert_eq!(text(&o).0, "", "nothing was stored");
}

/// The per-object rules CEL can say (`crate::cel`) are the server's: `kubectl apply` refuses a CIDR with
/// host bits, a gateway that is its network address, a reserved table, a `ge` beyond the family's
/// longest prefix, each with the field's path and a message saying what would be right.
#[tokio::test]
async fn the_server_refuses_what_cel_can_check_with_path_and_message() {
    let cp = with_crds().await;
    let refused = |yaml: &str, want: &[&str]| {
        let o = kubectl(&cp, &["apply", "-f", "-"], Some(yaml));
        let (_, err) = text(&o);
        assert!(!o.status.success(), "accepted:\n{yaml}");
        for w in want {
            assert!(err.contains(w), "the refusal says {w:?}:\n{err}");
        }
    };
    refused(
        r#"
apiVersion: netwave.dev/v1alpha1
kind: VRFRouteConfiguration
metadata: {name: host-bits}
spec:
  vrf: tenant
  seq: 1
  import: [{cidr: 10.0.76.81/28, action: permit}, {cidr: 10.1.0.0/16, ge: 33, action: deny}]
  aggregate: [fd00:1::1/64]
"#,
        &[
            "spec.import[0].cidr",
            "must be a network address, with no host bits set",
            "spec.import[1].ge",
            "ge must be from the prefix length of cidr to 32 (IPv4) or 128 (IPv6)",
            "spec.aggregate[0]",
            "must be a network address",
        ],
    );
    refused(
        r#"
apiVersion: netwave.dev/v1alpha1
kind: Underlay
metadata: {name: fabric}
spec:
  asn: 65000
  neighbors:
  - {address: fd00::1, remoteAs: internal}
  - {address: 198.18.0.254, interface: eth1, remoteAs: external}
  - {interface: eth2, remoteAs: ibgp}
  timers: {keepalive: 10, hold: 5}
"#,
        &[
            "spec.neighbors[0].address",
            "must be an IPv4 address",
            "spec.neighbors[1]",
            "exactly one of address (a numbered session) or interface (unnumbered) is required",
            "spec.neighbors[2].remoteAs",
            "spec.timers",
            "hold must be 0 (no hold timer) or at least 3 seconds and at least keepalive",
        ],
    );
    refused(
        r#"
apiVersion: netwave.dev/v1alpha1
kind: Layer2NetworkConfiguration
metadata: {name: gw-is-network}
spec: {id: 100, vni: 100, mtu: 1500, anycastGateways: [10.250.0.0/24, nonsense]}
"#,
        &[
            "spec.anycastGateways[0]",
            "must be a host address inside its prefix, not the network address",
            "spec.anycastGateways[1]",
            "must be an address with prefix length",
            "spec.anycastMac",
        ],
    );
    refused(
        r#"
apiVersion: netwave.dev/v1alpha1
kind: RoutingTable
metadata: {name: reserved}
spec:
  tableId: 254
  routes: [{prefix: 10.200.0.1/16, via: 10.250.11.300}]
  rules:
  - {from: 10.0.0.0/8, priority: 32766}
  - {fwmask: 255, priority: 1001}
  - {fwmark: 16, fwmask: 0, priority: 1002}
  - {fwmark: 0, priority: 1003}
"#,
        &[
            "spec.tableId",
            "tables 253, 254 and 255 are reserved",
            "spec.routes[0].prefix",
            "must be a network address",
            "spec.routes[0].via",
            "must be an IP address",
            "spec.rules[0].priority",
            "priorities 32766 and 32767 belong to the kernel's main/default rules",
            "spec.rules[1].fwmask",
            "a mask needs `fwmark`",
            "spec.rules[2].fwmask",
            "a mask of 0 compares no bit of the mark",
            "spec.rules[3].fwmark",
            "the kernel neither compares nor reports a zero mark without a mask",
        ],
    );
    refused(
        r#"
apiVersion: netwave.dev/v1alpha1
kind: BGPPeering
metadata: {name: both-kinds}
spec:
  peeringVlan: {name: vlan1}
  loopbackPeer: {ips: [10.250.3.300]}
  remoteASN: 65511
  import: [{cidr: 10.250.3.1/24, action: permit}]
  export: []
"#,
        &[
            "exactly one of peeringVlan (a layer-2 segment to listen on) or loopbackPeer",
            "spec.loopbackPeer.ips[0]",
            "must be an IP address",
            "spec.import[0].cidr",
            "must be a network address",
        ],
    );
    let o = kubectl(&cp, &["get", "l2,vrf,rt,bgpp", "-o", "name"], None);
    assert_eq!(text(&o).0, "", "nothing was stored");
    // The samples (good objects of every shape) still apply.
    ok(&cp, &["apply", "--dry-run=server", "-f", "deploy/samples/"]);
    // Marks that mean what they say pass: with and without a mask, and a zero mark under a mask.
    let marks = r#"
apiVersion: netwave.dev/v1alpha1
kind: RoutingTable
metadata: {name: marks}
spec:
  tableId: 100
  rules:
  - {fwmark: 16, priority: 1001}
  - {fwmark: 16, fwmask: 240, priority: 1002}
  - {fwmark: 0, fwmask: 255, priority: 1003}
"#;
    let o = kubectl(&cp, &["apply", "--dry-run=server", "-f", "-"], Some(marks));
    assert!(o.status.success(), "refused:\n{}", text(&o).1);
}

/// Server-side apply and `kubectl diff`, as an admin previews a change before making it.
#[tokio::test]
async fn server_side_apply_and_diff_show_a_change_before_it_is_made() {
    let cp = with_crds().await;
    ok(
        &cp,
        &[
            "apply",
            "--server-side",
            "--field-manager=admin",
            "-f",
            "deploy/samples/",
        ],
    );
    let diff = ["diff", "--server-side", "--field-manager=admin", "-f"];
    let o = kubectl(&cp, &[&diff[..], &["deploy/samples/"]].concat(), None);
    assert_eq!(o.status.code(), Some(0), "no change: {:?}", text(&o));

    let samples = std::fs::read_to_string(repo().join("deploy/samples/layer2.yaml")).unwrap();
    let changed = samples.replacen("mtu: 9000", "mtu: 8900", 1);
    assert_ne!(
        samples, changed,
        "the samples hold an MTU of 9000 to change"
    );
    let o = kubectl(&cp, &[&diff[..], &["-"]].concat(), Some(&changed));
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "a difference: {err}");
    assert!(
        out.contains("-  mtu: 9000") && out.contains("+  mtu: 8900"),
        "{out}"
    );

    // Another manager taking a field the admin applied is a conflict, not a silent overwrite.
    let o = kubectl(
        &cp,
        &[
            "apply",
            "--server-side",
            "--field-manager=someone-else",
            "-f",
            "-",
        ],
        Some(&changed),
    );
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("conflict") && err.contains(".spec.mtu"),
        "{err}"
    );
}

/// A revision is what its hash says: whoever may patch revisions (to pause or retry a rollout) cannot
/// change their hash or their inputs (stored apart, in the NetworkConfigInputs of the same name) — the
/// server refuses it with the rule's message — but the admin knobs move.
#[tokio::test]
async fn a_revisions_inputs_and_hash_are_immutable_on_the_server() {
    let cp = with_crds().await;
    let revision = r#"
apiVersion: netwave.dev/v1alpha1
kind: NetworkConfigRevision
metadata: {name: rev-immutable}
spec:
  hash: 0fa1a5b05bc57beaf942761fdfa21c27142c34326e9caae086eb35d12abe7f21
  sequence: 1
---
apiVersion: netwave.dev/v1alpha1
kind: NetworkConfigInputs
metadata: {name: rev-immutable}
spec:
  routingTables:
    - name: oob
      spec:
        tableId: 100
        routes: [{prefix: 10.200.0.0/16, via: 10.250.11.254}]
"#;
    let o = kubectl(&cp, &["create", "-f", "-"], Some(revision));
    assert!(o.status.success(), "{:?}", text(&o));

    // The edit from the issue: point a route of a Complete revision elsewhere, or add an object.
    for patch in [
        r#"[{"op":"replace","path":"/spec/routingTables/0/spec/routes/0/via","value":"10.0.0.99"}]"#,
        r#"[{"op":"add","path":"/spec/vrfs/-","value":{"name":"x","spec":{"vrf":"x","seq":1}}}]"#,
    ] {
        let o = kubectl(
            &cp,
            &["patch", "nci", "rev-immutable", "--type=json", "-p", patch],
            None,
        );
        let (_, err) = text(&o);
        assert!(!o.status.success(), "the edit {patch} was accepted");
        assert!(
            err.contains("the inputs of a revision are immutable"),
            "refused with the rule's message: {err}"
        );
    }
    let o = kubectl(
        &cp,
        &[
            "patch",
            "ncr",
            "rev-immutable",
            "--type=merge",
            "-p",
            r#"{"spec":{"hash":"f00"}}"#,
        ],
        None,
    );
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("spec.hash is immutable"),
        "{err}"
    );

    // The admin knobs still move.
    ok(
        &cp,
        &[
            "patch",
            "ncr",
            "rev-immutable",
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true,"retry":1,"rollout":{"maxUnavailable":3}}}"#,
        ],
    );
    let paused = ok(
        &cp,
        &[
            "get",
            "ncr",
            "rev-immutable",
            "-o",
            "jsonpath={.spec.paused}",
        ],
    );
    let via = ok(
        &cp,
        &[
            "get",
            "nci",
            "rev-immutable",
            "-o",
            "jsonpath={.spec.routingTables[0].spec.routes[0].via}",
        ],
    );
    assert_eq!((via.as_str(), paused.as_str()), ("10.250.11.254", "true"));
}

/// das-schiff-network-operator's BGP-as-a-service manifest (their `bgpaas` e2e BGPPeering, old API
/// group), with only `apiVersion` rewritten, applies with every field kept (the fixture the FRR goldens
/// render, crates/core/tests/golden/frr/das-schiff-bgpaas.yaml), and `kubectl get bgpp` shows it.
/// The das-schiff fields netwave does not implement (README, "das-schiff compatibility") are refused
/// by `kubectl apply`, naming each field, so a manifest that relies on one does not port silently.
#[tokio::test]
async fn das_schiff_fields_netwave_does_not_implement_are_refused_naming_the_field() {
    let cp = with_crds().await;
    let l2 = r#"
apiVersion: netwave.dev/v1alpha1
kind: Layer2NetworkConfiguration
metadata:
  name: vlan400
spec:
  id: 400
  vni: 400
  mtu: 1500
  advertiseNeighbors: true
  createMacVLANInterface: true
  disableSegmentation: true
"#;
    let o = kubectl(&cp, &["apply", "-f", "-"], Some(l2));
    let (out, err) = text(&o);
    assert!(!o.status.success(), "refused:\n{out}{err}");
    for field in [
        "spec.advertiseNeighbors",
        "spec.createMacVLANInterface",
        "spec.disableSegmentation",
    ] {
        assert!(
            err.contains(&format!("unknown field \"{field}\"")),
            "{field}: {err}"
        );
    }
    let vrf = r#"
apiVersion: netwave.dev/v1alpha1
kind: VRFRouteConfiguration
metadata:
  name: vrf-community
spec:
  vrf: blue
  seq: 10
  community: "65000:1"
"#;
    let o = kubectl(&cp, &["apply", "-f", "-"], Some(vrf));
    let (out, err) = text(&o);
    assert!(!o.status.success(), "refused:\n{out}{err}");
    assert!(err.contains("unknown field \"spec.community\""), "{err}");
    let o = kubectl(&cp, &["get", "l2,vrf", "-o", "name"], None);
    let (listed, _) = text(&o);
    assert!(
        !listed.contains("vlan400") && !listed.contains("vrf-community"),
        "nothing stored: {listed}"
    );
}

#[tokio::test]
async fn das_schiffs_bgpaas_peering_applies_with_only_the_api_version_changed() {
    let cp = with_crds().await;
    let fixture = repo().join("crates/core/tests/golden/frr/das-schiff-bgpaas.yaml");
    let yaml = std::fs::read_to_string(&fixture).expect("fixture");
    let out = ok(&cp, &["apply", "-f", fixture.to_str().expect("utf-8")]);
    assert!(
        out.contains("bgppeering.netwave.dev/bgpaas-test created"),
        "{out}"
    );
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).expect("fixture YAML");
    for doc in docs.iter().filter(|d| d["kind"] == "BGPPeering") {
        let name = doc["metadata"]["name"].as_str().expect("name");
        let stored: serde_json::Value =
            serde_json::from_str(&ok(&cp, &["get", "bgpp", name, "-o", "json"])).expect("JSON");
        // With the default prefix limit where the fixture has none.
        let mut written = doc.clone();
        netwave_api::defaults::apply("BGPPeering", &mut written);
        assert_eq!(
            stored["spec"], written["spec"],
            "{name}: every field kept as written"
        );
    }
    let listed = ok(&cp, &["get", "bgpp"]);
    let header: Vec<&str> = listed.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "VLAN", "ASN", "BFD", "ACCEPTED", "NODES", "AGE"],
        "{listed}"
    );
    let row = listed
        .lines()
        .find(|l| l.starts_with("bgpaas-test "))
        .expect("listed");
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cols[..4],
        ["bgpaas-test", "vlan1", "65511", "false"],
        "{listed}"
    );
    let again = ok(&cp, &["apply", "-f", fixture.to_str().expect("utf-8")]);
    assert!(again.lines().all(|l| l.ends_with(" unchanged")), "{again}");
}

/// das-schiff-network-operator's traffic-mirror e2e manifests (their mirror VRF, collector segment and
/// both MirrorTargets, and MirrorSelectors as their e2e makes them, references to their API group
/// kept), with only `apiVersion` rewritten, apply with every field kept (the fixture core's mirror
/// tests render, crates/core/tests/golden/mirror/das-schiff-mirror.yaml).
/// A workload session always has a prefix limit (#48): a BGPPeering that names none, or names null,
/// is stored with the default, so a workload cannot fill the node's bgpd; `plan -f` folds the same
/// value from the file, so it does not show the default as a change.
#[tokio::test]
async fn a_peering_without_a_prefix_limit_is_stored_with_the_default() {
    let cp = with_crds().await;
    let yaml = r#"
apiVersion: netwave.dev/v1alpha1
kind: BGPPeering
metadata: {name: no-limit}
spec:
  loopbackPeer: {ips: [198.18.0.10]}
  remoteASN: 65511
  import: [{cidr: 198.18.0.0/16, le: 32, action: permit}]
  export: []
---
apiVersion: netwave.dev/v1alpha1
kind: BGPPeering
metadata: {name: null-limit}
spec:
  loopbackPeer: {ips: [198.18.0.11]}
  remoteASN: 65512
  maximumPrefixes: null
  import: []
  export: []
"#;
    let o = kubectl(&cp, &["apply", "-f", "-"], Some(yaml));
    assert!(o.status.success(), "{:?}", text(&o));
    for name in ["no-limit", "null-limit"] {
        let stored = ok(
            &cp,
            &[
                "get",
                "bgpp",
                name,
                "-o",
                "jsonpath={.spec.maximumPrefixes}",
            ],
        );
        assert_eq!(
            stored,
            netwave_api::DEFAULT_MAXIMUM_PREFIXES.to_string(),
            "{name}"
        );
    }
    let parsed = netwave_api::manifest::parse_manifests("peerings.yaml", yaml).expect("parses");
    for m in &parsed {
        let p = m.input::<netwave_api::BGPPeering>().expect("a BGPPeering");
        assert_eq!(
            p.spec.maximum_prefixes,
            Some(netwave_api::DEFAULT_MAXIMUM_PREFIXES),
            "{}",
            m.name()
        );
    }
}

#[tokio::test]
async fn das_schiffs_mirror_manifests_apply_with_only_the_api_version_changed() {
    let cp = with_crds().await;
    let fixture = repo().join("crates/core/tests/golden/mirror/das-schiff-mirror.yaml");
    let yaml = std::fs::read_to_string(&fixture).expect("fixture");
    let out = ok(&cp, &["apply", "-f", fixture.to_str().expect("utf-8")]);
    for created in [
        "mirrortarget.netwave.dev/collector-prod created",
        "mirrortarget.netwave.dev/collector-prod-v6 created",
        "mirrorselector.netwave.dev/mirror-l2-ingress created",
        "mirrorselector.netwave.dev/mirror-vrf-ingress-v6 created",
    ] {
        assert!(out.contains(created), "{out}");
    }
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).expect("fixture YAML");
    for doc in docs
        .iter()
        .filter(|d| d["kind"] == "MirrorTarget" || d["kind"] == "MirrorSelector")
    {
        let kind = doc["kind"].as_str().expect("kind").to_ascii_lowercase();
        let name = doc["metadata"]["name"].as_str().expect("name");
        let stored: serde_json::Value =
            serde_json::from_str(&ok(&cp, &["get", &kind, name, "-o", "json"])).expect("JSON");
        assert_eq!(
            stored["spec"], doc["spec"],
            "{kind}/{name}: every field kept as written"
        );
    }
    let listed = ok(&cp, &["get", "mirrortarget"]);
    let header: Vec<&str> = listed.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "TYPE",
            "DESTINATION",
            "VRF",
            "ACCEPTED",
            "SELECTORS",
            "NODES",
            "AGE"
        ],
        "{listed}"
    );
    let again = ok(&cp, &["apply", "-f", fixture.to_str().expect("utf-8")]);
    assert!(again.lines().all(|l| l.ends_with(" unchanged")), "{again}");
}

/// What one MirrorSelector or MirrorTarget shows wrong on its own, the server refuses with the path.
#[tokio::test]
async fn the_server_refuses_a_bad_mirror_naming_the_field() {
    let cp = with_crds().await;
    let refused = |yaml: &str, want: &[&str]| {
        let o = kubectl(&cp, &["apply", "-f", "-"], Some(yaml));
        let (_, err) = text(&o);
        assert!(!o.status.success(), "accepted:\n{yaml}");
        for w in want {
            assert!(err.contains(w), "the refusal says {w:?}:\n{err}");
        }
    };
    refused(
        r#"
apiVersion: netwave.dev/v1alpha1
kind: MirrorSelector
metadata: {name: bad}
spec:
  trafficMatch: {protocol: icmp, dstPort: 443}
  mirrorTarget: {kind: Layer2NetworkConfiguration, name: x}
  mirrorSource: {apiGroup: example.com, kind: RoutingTable, name: rt1}
  direction: egress
"#,
        &[
            "spec.trafficMatch.protocol",
            "ports match only tcp, udp or sctp",
            "spec.mirrorTarget.kind",
            "kind must be one of MirrorTarget",
            "spec.mirrorSource.apiGroup",
            "spec.mirrorSource.kind",
        ],
    );
    refused(
        r#"
apiVersion: netwave.dev/v1alpha1
kind: MirrorSelector
metadata: {name: bad}
spec:
  mirrorTarget: {kind: MirrorTarget, name: col}
  mirrorSource: {kind: Layer2NetworkConfiguration, name: vlan1}
  direction: sideways
"#,
        &[
            "spec.direction",
            "supported values: \"ingress\", \"egress\"",
        ],
    );
    refused(
        r#"
apiVersion: netwave.dev/v1alpha1
kind: MirrorTarget
metadata: {name: bad}
spec: {type: l3gre, destinationIP: 10.250.90, destinationVrf: mirror, sourceLoopback: lo.mir}
"#,
        &["spec.destinationIP", "must be an IP address"],
    );
    refused(
        r#"
apiVersion: netwave.dev/v1alpha1
kind: MirrorTarget
metadata: {name: bad}
spec: {type: l4gre, destinationIP: 10.250.90.100, destinationVrf: mirror, sourceLoopback: lo.mir}
"#,
        &["spec.type", "supported values: \"l2gre\", \"l3gre\""],
    );
}
