//! `deploy/` must stay true to the code: every manifest is valid YAML, and every metric the alerts and
//! the dashboard query exists in the configurator's or the agent's registry.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn deploy_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let mut out = Vec::new();
    for dir in [root.join("base"), root.join("monitoring")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            // Kustomizations are checked by rendering them (tests/install.rs).
            if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
                continue;
            }
            if p.extension().is_some_and(|x| x == "yaml" || x == "json") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Base names of the metrics a registry exposes (`# TYPE <name> <type>` lines).
fn exposed() -> BTreeSet<String> {
    use netwave_agent::shell::metrics as agent;
    use netwave_configurator::metrics as configurator;
    // Labelled families appear once a label set exists: create one of each.
    let c = configurator::Metrics::default();
    let _ = c
        .assignments
        .get_or_create(&configurator::ReasonLabels { reason: "Rollout" });
    let verb = configurator::Verb::patch;
    let _ = c.api_errors.get_or_create(&configurator::ApiErrorLabels {
        verb,
        category: "server",
    });
    let a = agent::Metrics::default();
    let _ = a.applies.get_or_create(&agent::ApplyLabels {
        phase: "Invalid",
        reason: "ApplyFailed",
    });
    let _ = a.probe_up.get_or_create(&agent::ProbeLabels {
        probe: "api".into(),
    });
    let _ = a.probe_duration.get_or_create(&agent::ProbeLabels {
        probe: "api".into(),
    });
    let text = c.encode() + &a.encode();
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// `netwave_*` names in a text, with sample suffixes stripped to the metric's base name.
fn referenced(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("netwave_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let base = ["_total", "_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name)
            .to_string();
        out.insert(base);
    }
    out
}

#[test]
fn manifests_parse() {
    let files = deploy_files();
    assert!(files.len() >= 4, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        if f.extension().is_some_and(|x| x == "json") {
            serde_json::from_str::<serde_json::Value>(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        } else {
            let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            for d in docs.iter().filter(|d| !d.is_null()) {
                assert!(
                    d["kind"].is_string() && d["metadata"]["name"].is_string(),
                    "{}: {d}",
                    f.display()
                );
            }
        }
    }
}

#[test]
fn alerts_and_dashboard_query_metrics_that_exist() {
    let exposed = exposed();
    let monitoring = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring");
    let mut checked = 0;
    for f in ["prometheusrule.yaml", "grafana-dashboard.json"] {
        let text = std::fs::read_to_string(monitoring.join(f)).unwrap();
        let names = referenced(&text);
        assert!(!names.is_empty(), "{f} queries no netwave metric");
        let missing: Vec<_> = names.iter().filter(|n| !exposed.contains(*n)).collect();
        assert!(
            missing.is_empty(),
            "{f} queries metrics nobody exposes: {missing:?}\nexposed: {exposed:?}"
        );
        checked += names.len();
    }
    assert!(checked >= 10);
}
