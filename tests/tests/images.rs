//! The container images `make images` builds (images/build.sh, one OCI image layout per image under
//! target/images/: the configurator, the agent, the agent with FRR), checked as a container runtime would
//! see them, and deploy/ naming exactly those tags.
//!
//! ```text
//! Cargo.toml version ──► binaries' --version ──► image tag v<version> + org.opencontainers.image.version
//!                    └─► deploy/base/kustomization.yaml images: newTag ──► rendered Deployment/DaemonSet
//! ```
//!
//! Nothing is built here. A missing image fails with "run `make images`" (`make test` runs it first), so
//! the smoke test can never pass by having nothing to look at.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

/// The workspace version (`version.workspace = true`): the one place the images' version lives.
const VERSION: &str = env!("CARGO_PKG_VERSION");
const REGISTRY: &str = "ghcr.io/netwave";

struct Image {
    name: &'static str,
    /// The binary at /usr/local/bin/<binary>, the entrypoint.
    binary: &'static str,
    /// The image config's `User`, as the pod's securityContext expects it.
    user: &'static str,
    /// With FRR from Debian (the EVPN agent); otherwise the image holds its binary and nothing else.
    frr: bool,
}

const CONFIGURATOR: Image = Image {
    name: "netwave-configurator",
    binary: "netwave-configurator",
    // runAsNonRoot in deploy/base/configurator.yaml: a numeric non-root user the kubelet can verify.
    user: "65532:65532",
    frr: false,
};
const AGENT: Image = Image {
    name: "netwave-agent",
    binary: "netwave-agent",
    // The agent needs NET_ADMIN/NET_RAW, which runtimes grant to uid 0 only.
    user: "0:0",
    frr: false,
};
const AGENT_FRR: Image = Image {
    name: "netwave-agent-frr",
    binary: "netwave-agent",
    user: "0:0",
    frr: true,
};
/// The images each install renders: deploy/base (and its monitoring overlay) installs the plain agent,
/// deploy/overlays/evpn the FRR variant instead.
const DEPLOYED: [(&str, [Image; 2]); 3] = [
    ("deploy/base", [CONFIGURATOR, AGENT]),
    ("deploy/overlays/monitoring", [CONFIGURATOR, AGENT]),
    ("deploy/overlays/evpn", [CONFIGURATOR, AGENT_FRR]),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tag() -> String {
    format!("v{VERSION}")
}

/// One image as its OCI layout holds it: the config and the layer blobs, in order.
struct Layout {
    dir: PathBuf,
    config: Value,
    layers: Vec<PathBuf>,
}

fn json(path: &Path) -> Result<Value> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
}

fn blob(dir: &Path, digest: &Value) -> Result<PathBuf> {
    let digest = digest.as_str().context("a descriptor without a digest")?;
    let hex = digest
        .strip_prefix("sha256:")
        .with_context(|| format!("digest {digest} is not sha256"))?;
    let p = dir.join("blobs/sha256").join(hex);
    ensure!(
        p.is_file(),
        "blob {digest} is missing from {}",
        dir.display()
    );
    Ok(p)
}

/// The image `name:v<version>` from target/images/<name>, or an error telling how to build it.
fn layout(name: &str) -> Result<Layout> {
    let dir = repo().join("target/images").join(name);
    let index_path = dir.join("index.json");
    if !index_path.is_file() {
        bail!(
            "{} is missing: run `make images` first (`make test` does)",
            index_path.display()
        );
    }
    let index = json(&index_path)?;
    let tag = tag();
    let manifest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag.as_str())
        .with_context(|| {
            format!(
                "{} has no image tagged {tag} (the workspace version): run `make images`\n{index}",
                dir.display()
            )
        })?;
    let manifest = json(&blob(&dir, &manifest["digest"])?)?;
    let config = json(&blob(&dir, &manifest["config"]["digest"])?)?;
    let mut layers = Vec::new();
    for l in manifest["layers"]
        .as_array()
        .context("manifest without layers")?
    {
        ensure!(
            l["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip",
            "{name}: unexpected layer type {}",
            l["mediaType"]
        );
        layers.push(blob(&dir, &l["digest"])?);
    }
    Ok(Layout {
        dir,
        config,
        layers,
    })
}

/// Unpacks the layers in order into a fresh directory (no whiteouts: no layer deletes anything).
fn unpack(image: &Layout, name: &str) -> Result<PathBuf> {
    let rootfs = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("images")
        .join(name);
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs)?;
    }
    std::fs::create_dir_all(&rootfs)?;
    for layer in &image.layers {
        let out = Command::new("tar")
            .arg("-xzf")
            .arg(layer)
            .arg("-C")
            .arg(&rootfs)
            .output()
            .context("running tar")?;
        ensure!(
            out.status.success(),
            "unpacking {}: {}",
            layer.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(rootfs)
}

/// Every file (not directory) under `root`, relative and sorted.
fn files(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.symlink_metadata()?.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(root)?.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether an ELF64 little-endian executable asks for a program interpreter (PT_INTERP), i.e. is
/// dynamically linked and cannot run on an empty base.
fn has_interpreter(elf: &[u8]) -> Result<bool> {
    ensure!(
        elf.len() >= 64 && &elf[..4] == b"\x7fELF" && elf[4] == 2 && elf[5] == 1,
        "not a 64-bit little-endian ELF file"
    );
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[32..40].try_into()?) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        ensure!(at + 4 <= elf.len(), "program header {i} out of bounds");
        if u32::from_le_bytes(elf[at..at + 4].try_into()?) == 3 {
            return Ok(true);
        }
    }
    Ok(false)
}

fn euid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Runs `argv` inside `rootfs` as `user` (uid:gid) with nothing but the image's files: chroot as root;
/// otherwise in a user namespace where we are root (then as that namespace's root, not `user`).
fn run_in(rootfs: &Path, user: &str, argv: &[&str]) -> Result<String> {
    let mut cmd = if euid_is_root() {
        let mut c = Command::new("chroot");
        c.arg(format!("--userspec={user}"));
        c
    } else {
        let mut c = Command::new("unshare");
        c.args(["--map-root-user", "chroot"]);
        c
    };
    let out = cmd
        .arg(rootfs)
        .args(argv)
        .output()
        .context("running chroot")?;
    ensure!(
        out.status.success(),
        "{argv:?} in {} failed ({}): {}",
        rootfs.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

fn check_image(image: &Image) -> Result<()> {
    let name = image.name;
    let layout = layout(name)?;
    let cfg = &layout.config;
    let binary = format!("/usr/local/bin/{}", image.binary);

    // What the kubelet runs: the binary itself (deploy/ passes only args), as the expected user.
    ensure!(
        cfg["os"] == "linux" && cfg["architecture"] == "amd64",
        "{name}: platform {cfg}"
    );
    ensure!(
        cfg["config"]["Entrypoint"] == serde_json::json!([binary]),
        "{name}: entrypoint {}",
        cfg["config"]["Entrypoint"]
    );
    ensure!(
        cfg["config"]["Cmd"].is_null(),
        "{name}: a default Cmd would be appended to nothing deploy/ expects: {}",
        cfg["config"]["Cmd"]
    );
    ensure!(
        cfg["config"]["User"] == image.user,
        "{name}: user {} (expected {})",
        cfg["config"]["User"],
        image.user
    );
    let labels = &cfg["config"]["Labels"];
    for (key, want) in [
        ("org.opencontainers.image.version", VERSION),
        ("org.opencontainers.image.title", name),
        ("org.opencontainers.image.licenses", "Apache-2.0"),
    ] {
        ensure!(
            labels[key] == want,
            "{name}: label {key} = {} (expected {want})",
            labels[key]
        );
    }
    for key in [
        "org.opencontainers.image.source",
        "org.opencontainers.image.revision",
    ] {
        ensure!(
            labels[key]
                .as_str()
                .is_some_and(|v| !v.is_empty() && v != "unknown"),
            "{name}: label {key} is missing or empty: {labels}"
        );
    }

    let rootfs = unpack(&layout, name)?;
    let content = files(&rootfs)?;
    if image.frr {
        // What the agent runs (its defaults) and what a sidecar would run from the same image.
        for f in [
            binary.as_str(),
            "/usr/bin/vtysh",
            "/usr/lib/frr/frr-reload.py",
            "/usr/lib/frr/zebra",
            "/usr/lib/frr/bgpd",
            "/usr/lib/frr/watchfrr",
            "/usr/local/bin/netwave-frr",
        ] {
            ensure!(
                content.iter().any(|c| c == f.trim_start_matches('/')),
                "{name}: {f} is missing"
            );
        }
    } else {
        // The root filesystem holds the binary and nothing else: no shell, no libc, no loader.
        ensure!(
            content == [binary.trim_start_matches('/')],
            "{name}: the image holds more than its binary: {content:?}"
        );
    }
    let path = rootfs.join(binary.trim_start_matches('/'));
    ensure!(
        !has_interpreter(&std::fs::read(&path)?)?,
        "{name}: {} is dynamically linked (it has a program interpreter); an empty base cannot run it",
        path.display()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path)?.permissions().mode() & 0o7777;
    ensure!(
        mode == 0o555,
        "{name}: binary mode {mode:o}, expected 555 (not writable)"
    );

    // And it runs there, from the image's own files only, printing the workspace version.
    let out = run_in(&rootfs, image.user, &[&binary, "--version"])?;
    let want = format!("{} {VERSION}", image.binary);
    ensure!(
        out.trim() == want,
        "{name}: {binary} --version in the image printed {out:?}, expected {want:?} ({})",
        layout.dir.display()
    );
    // A released agent cannot be told to render differently: the upgrade drill's flag is in test
    // builds only (the `rendering-drill` feature).
    let help = run_in(&rootfs, image.user, &[&binary, "--help"])?;
    ensure!(
        !help.contains("rendering-drill"),
        "{name}: {binary} --help offers --rendering-drill, a test-only flag"
    );
    if image.frr {
        // FRR's own programs run from the image: vtysh's dry run (the agent's check before every apply)
        // accepts a config, and frr-reload.py starts under the image's python3.
        std::fs::write(
            rootfs.join("check.conf"),
            "router bgp 65000\n bgp router-id 192.0.2.1\n",
        )?;
        run_in(
            &rootfs,
            image.user,
            &["/usr/bin/vtysh", "-C", "-f", "/check.conf"],
        )?;
        let help = run_in(
            &rootfs,
            image.user,
            &["/usr/bin/python3", "/usr/lib/frr/frr-reload.py", "--help"],
        )?;
        ensure!(
            help.contains("--reload"),
            "{name}: frr-reload.py --help printed {help:?}"
        );
        // FRR's user and groups have the ids deploy/overlays/evpn's supplementalGroups names.
        let passwd = std::fs::read_to_string(rootfs.join("etc/passwd"))?;
        let group = std::fs::read_to_string(rootfs.join("etc/group"))?;
        ensure!(
            passwd.lines().any(|l| l.starts_with("frr:x:990:990:")),
            "{name}: user frr is not uid 990 / gid 990: {passwd}"
        );
        ensure!(
            group.lines().any(|l| l.starts_with("frrvty:x:991:")),
            "{name}: group frrvty is not gid 991: {group}"
        );
        let overlay = std::fs::read_to_string(repo().join("deploy/overlays/evpn/agent-frr.yaml"))?;
        ensure!(
            overlay.contains("supplementalGroups: [991]"),
            "deploy/overlays/evpn/agent-frr.yaml no longer gives the pod group frrvty (991)"
        );
        let zebra = run_in(&rootfs, image.user, &["/usr/lib/frr/zebra", "--version"])?;
        ensure!(
            zebra.starts_with("zebra version 8."),
            "{name}: zebra --version printed {zebra:?}"
        );
    }
    Ok(())
}

#[test]
fn configurator_image_runs_as_non_root_with_its_binary_only() -> Result<()> {
    check_image(&CONFIGURATOR)
}

#[test]
fn agent_image_runs_its_static_binary_only() -> Result<()> {
    check_image(&AGENT)
}

#[test]
fn agent_frr_image_runs_the_agent_and_frr() -> Result<()> {
    check_image(&AGENT_FRR)
}

/// `image:` values in a YAML text (manifests name images on one line; kustomize renders them so too).
fn image_refs(yaml: &str) -> Vec<String> {
    yaml.lines()
        .filter_map(|l| {
            l.trim_start()
                .trim_start_matches("- ")
                .strip_prefix("image:")
        })
        .map(|v| {
            v.split(" #")
                .next()
                .unwrap_or(v)
                .trim()
                .trim_matches('"')
                .to_string()
        })
        .collect()
}

/// deploy/ installs exactly the images `make images` builds: the rendered base and overlay name each
/// image once with the workspace version's tag, and the manifests leave the tag to the kustomization.
#[test]
fn deploy_names_the_images_with_the_workspace_version() -> Result<()> {
    let kubectl = &netwave_control_plane::binaries()?.kubectl;
    for (dir, images) in &DEPLOYED {
        let want: BTreeSet<String> = images
            .iter()
            .map(|i| format!("{REGISTRY}/{}:{}", i.name, tag()))
            .collect();
        let out = Command::new(kubectl)
            .args(["kustomize", dir])
            .current_dir(repo())
            .output()?;
        ensure!(
            out.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let refs = image_refs(&String::from_utf8(out.stdout)?);
        let got: BTreeSet<String> = refs.iter().cloned().collect();
        ensure!(
            got == want,
            "{dir} renders images {refs:?}, expected {want:?} (deploy/base/kustomization.yaml `images:` \
             must give each the tag v<workspace version>)"
        );
    }
    // The tag lives in kustomization.yaml only: a manifest with its own tag would be a second place.
    let manifests = [
        repo().join("deploy/base"),
        repo().join("deploy/overlays/evpn"),
    ]
    .into_iter()
    .map(std::fs::read_dir)
    .collect::<std::io::Result<Vec<_>>>()?;
    for e in manifests.into_iter().flatten() {
        let p = e?.path();
        if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
            continue;
        }
        for r in image_refs(&std::fs::read_to_string(&p)?) {
            let last = r.rsplit('/').next().unwrap_or(&r);
            ensure!(
                !last.contains(':') && !last.contains('@'),
                "{}: image {r} carries its own tag; leave it to kustomization.yaml `images:`",
                p.display()
            );
        }
    }
    Ok(())
}

/// The static check can fail: this test binary is an ordinary dynamically linked one.
#[test]
fn a_dynamically_linked_binary_is_caught() -> Result<()> {
    ensure!(has_interpreter(&std::fs::read(std::env::current_exe()?)?)?);
    Ok(())
}
