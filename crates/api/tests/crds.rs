//! The CRDs committed in `crds/` must be exactly what the Rust types generate: a cluster must never run a
//! schema that differs from the code reading it.

use std::path::Path;

#[test]
fn committed_crds_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let mut drifted = Vec::new();
    for (file, crd) in netwave_api::crds() {
        let want = netwave_api::crd_yaml(&crd);
        let have = std::fs::read_to_string(dir.join(&file)).unwrap_or_default();
        if have != want {
            let diff = similar::TextDiff::from_lines(&have, &want);
            drifted.push(format!(
                "crds/{file} differs from the Rust types:\n{}",
                diff.unified_diff().header("committed", "generated")
            ));
        }
    }
    let have =
        std::fs::read_to_string(dir.join(netwave_api::CRDS_KUSTOMIZATION)).unwrap_or_default();
    if have != netwave_api::crds_kustomization() {
        drifted.push("crds/Kustomization does not list the generated CRDs".to_string());
    }
    // `kubectl apply -f crds/` reads every .yaml, .yml and .json file there: each must be a CRD we
    // generate, or the command fails after creating the others (a kustomization.yaml did).
    let generated: Vec<String> = netwave_api::crds().into_iter().map(|(f, _)| f).collect();
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let read_by_apply = [".yaml", ".yml", ".json"].iter().any(|x| name.ends_with(x));
        if read_by_apply && !generated.contains(&name) {
            drifted.push(format!(
                "crds/{name} is not a generated CRD, so `kubectl apply -f crds/` fails on it"
            ));
        }
    }
    assert!(
        drifted.is_empty(),
        "{}\nRun `make crds` and commit the result.",
        drifted.join("\n")
    );
}

#[test]
fn every_kind_is_cluster_scoped_with_short_name_and_columns() {
    let crds = netwave_api::crds();
    let short: Vec<_> = crds
        .iter()
        .map(|(_, c)| {
            c.spec
                .names
                .short_names
                .clone()
                .unwrap_or_default()
                .join(",")
        })
        .collect();
    assert_eq!(
        short,
        [
            "vrf",
            "l2",
            "rt",
            "bgpp",
            "mirrortarget",
            "mirrorselector",
            "ul",
            "ncr",
            "nci",
            "nnc"
        ]
    );
    for (file, crd) in &crds {
        assert_eq!(crd.spec.scope, "Cluster", "{file}");
        assert_eq!(crd.spec.group, "netwave.dev", "{file}");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .additional_printer_columns
                .as_ref()
                .is_some_and(|c| c.len() >= 2),
            "{file}"
        );
    }
    // Every kind has a status subresource: the inputs carry the configurator's verdict on them. A
    // revision's inputs are a write-once snapshot with nothing to report (the revision has the status).
    for (file, crd) in crds
        .iter()
        .filter(|(f, _)| *f != "networkconfiginputs.yaml")
    {
        let sub = crd.spec.versions[0].subresources.as_ref();
        assert!(
            sub.and_then(|s| s.status.as_ref()).is_some(),
            "{file} needs a status subresource"
        );
    }
}

#[test]
fn status_fields_are_strings_not_enums() {
    // An older CRD must accept status written by a newer netwave, or a rollback of netwave breaks.
    for (file, crd) in netwave_api::crds()
        .iter()
        .filter(|(f, _)| *f != "networkconfiginputs.yaml")
    {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let status = &schema["openAPIV3Schema"]["properties"]["status"];
        assert!(status.is_object(), "{file}");
        assert!(
            !status.to_string().contains("\"enum\""),
            "{file}: status has an enum"
        );
    }
}
