//! The render version's tripwire (#46). What the samples and the golden fixtures render to, one
//! `configHash` per node, is recorded per `RENDER_VERSION` in `tests/golden/render/v<N>.txt`. A change
//! to what the same inputs render to fails here until `RENDER_VERSION` is bumped and the new version's
//! file is written: `UPDATE_GOLDEN=1` writes the file of a version that has none, and never rewrites
//! one that exists. A configurator whose rendering differs then cuts a new revision, which rolls out in
//! waves under the gate, instead of rewriting the node configs of the running revision on every node
//! at once.
//!
//! The fixtures are read as the API server stores them, with their CRDs' defaults
//! (`netwave_api::defaults`): a new default changes the inputs, so their lines change in every
//! version's file (0.2.0's `maximumPrefixes` default changed das-schiff-bgpaas's), not the render
//! version.

mod support_inputs;

use std::path::{Path, PathBuf};

use netwave_api::RevisionInputs;
use netwave_api::manifest::parse_manifests;
use netwave_core::fleet::{Check, FleetParams, render_and_validate};
use netwave_core::render::{
    RENDER_VERSION, RenderError, render, render_version_of, stamp_render_version,
};
use netwave_core::revision::inputs_hash;
use support_inputs::{node, sample_inputs, sample_nodes};

fn golden(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(dir)
}

fn fixture(path: PathBuf) -> RevisionInputs {
    let text = std::fs::read_to_string(&path).expect("fixture");
    let source = path.display().to_string();
    let mut inputs = RevisionInputs::default();
    for m in parse_manifests(&source, &text).expect("fixture parses") {
        inputs.add(m).expect("an input object");
    }
    inputs
}

/// Every recorded line: `<fixture> <node> <configHash>`.
fn rendered_lines() -> Vec<String> {
    let fixtures = [
        ("samples", sample_inputs()),
        ("das-schiff", fixture(golden("frr").join("das-schiff.yaml"))),
        (
            "das-schiff-bgpaas",
            fixture(golden("frr").join("das-schiff-bgpaas.yaml")),
        ),
        (
            "das-schiff-mirror",
            fixture(golden("mirror").join("das-schiff-mirror.yaml")),
        ),
    ];
    let mut nodes = sample_nodes();
    nodes.push(node("worker-0", &[]));
    nodes.push(node(
        "worker-1",
        &[("node-restriction.kubernetes.io/netwave-bgpaas", "true")],
    ));
    let mut lines = Vec::new();
    for (name, inputs) in fixtures {
        let rendered = render(&inputs, &nodes).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (node, r) in rendered {
            lines.push(format!("{name} {node} {}", r.config_hash));
        }
    }
    lines
}

#[test]
fn the_same_inputs_render_the_same_configs_under_one_render_version() {
    let file = golden("render").join(format!("v{RENDER_VERSION}.txt"));
    let lines = rendered_lines();
    let text = lines.join("\n") + "\n";
    let Ok(recorded) = std::fs::read_to_string(&file) else {
        if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, &text).unwrap();
            return;
        }
        panic!(
            "{} is missing: render version {RENDER_VERSION} has no record of what it renders \
             (UPDATE_GOLDEN=1 writes it)",
            file.display()
        );
    };
    let changed: Vec<&String> = lines
        .iter()
        .filter(|l| !recorded.lines().any(|r| r == l.as_str()))
        .collect();
    assert!(
        recorded == text,
        "the same inputs now render to other node configs than render version {RENDER_VERSION} \
         recorded in {}; changed or new: {changed:#?}\n\
         Bump RENDER_VERSION in crates/core/src/render.rs and run UPDATE_GOLDEN=1 (it writes the new \
         version's file): an upgraded configurator then cuts a new revision that rolls out in waves, \
         instead of rewriting every node's config of the running revision at once. A render version's \
         file is never rewritten.",
        file.display()
    );
}

#[test]
fn a_render_version_other_than_this_builds_is_refused_not_rendered() {
    let mut inputs = sample_inputs();
    stamp_render_version(&mut inputs, RENDER_VERSION + 1);
    assert_eq!(render_version_of(&inputs), RENDER_VERSION + 1);
    assert_eq!(
        render(&inputs, &sample_nodes()).err(),
        Some(RenderError::OtherVersion {
            recorded: RENDER_VERSION + 1
        })
    );
    // Fleet validation says so, so an empty render never passes as a valid one.
    let checked = render_and_validate(&inputs, &sample_nodes(), &FleetParams::default());
    assert!(checked.nodes.is_empty());
    let error = &checked.validation.errors[0];
    assert_eq!(error.check, Check::RenderVersion);
    assert!(
        error.message.contains(&format!(
            "spec.renderVersion: {}, and this build renders version {RENDER_VERSION}",
            RENDER_VERSION + 1
        )),
        "{error}"
    );
}

#[test]
fn the_render_version_is_part_of_the_hash_and_version_1_is_recorded_as_nothing() {
    let plain = sample_inputs();
    let mut one = sample_inputs();
    stamp_render_version(&mut one, 1);
    assert_eq!(one.render_version, None);
    assert_eq!(inputs_hash(&one), inputs_hash(&plain));
    let mut two = sample_inputs();
    stamp_render_version(&mut two, 2);
    assert_ne!(inputs_hash(&two), inputs_hash(&plain));
    let json = serde_json::to_value(&two).unwrap();
    assert_eq!(json["renderVersion"], 2);
    assert!(
        serde_json::to_value(&plain)
            .unwrap()
            .get("renderVersion")
            .is_none()
    );
}
