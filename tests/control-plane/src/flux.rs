//! Flux (source-controller and kustomize-controller v1.9.6, built from Go modules by
//! `tests/flux/build.sh`) on a hub control plane, fetching a local Git repository served over Git's
//! smart HTTP protocol (`git-http`: git's own `git-http-backend`), for the many-clusters tests (#50).
//!
//! ```text
//!  test ──git commit/push──▶ fleet.git ◀──HTTP── source-controller ──artifact (HTTP)──▶ kustomize-controller
//!                                                  │ (hub's KUBECONFIG)                      │ applies to the hub or,
//!                                                  ▼                                         ▼ by kubeConfig.secretRef,
//!                                                 hub kube-apiserver                        another cluster
//! ```
//!
//! Every process runs under the control plane's watchdog, so none outlives the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::{ControlPlane, Supervised, free_port};

/// The namespace Flux's objects live in on the hub.
pub const NAMESPACE: &str = "flux-system";
/// The repository's branch.
pub const BRANCH: &str = "main";

/// Builds or reuses Flux's binaries and CRDs (`tests/flux/build.sh`) once per process; their directory.
pub fn binaries() -> Result<&'static Path> {
    static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| super::built_by("../flux/build.sh"))
        .as_deref()
        .map_err(|e| anyhow::anyhow!("Flux is not available: {e}"))
}

/// Flux's controllers on a hub, and the Git repository they fetch.
pub struct Flux {
    dir: tempfile::TempDir,
    url: String,
    processes: Vec<Supervised>,
}

impl Flux {
    /// Installs Flux's CRDs and namespace on `hub`, creates an empty repository, and starts git-http,
    /// source-controller and kustomize-controller; returns once both controllers report ready.
    /// `requeue_dependency` is how often kustomize-controller re-checks a Kustomization whose
    /// `dependsOn` is not ready (Flux's default is 30 s).
    pub async fn start(hub: &ControlPlane, requeue_dependency: Duration) -> Result<Flux> {
        let bin = binaries()?;
        let out = hub
            .kubectl()
            .args(["apply", "--server-side", "-f"])
            .arg(bin.join("crds"))
            .output()?;
        if !out.status.success() {
            bail!(
                "installing Flux's CRDs: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let client = hub.client().await?;
        hub.ensure_namespace(&client, NAMESPACE).await?;

        let dir = tempfile::Builder::new().prefix("netwave-flux-").tempdir()?;
        let work = dir.path().join("work");
        for d in ["repos", "storage"] {
            std::fs::create_dir_all(dir.path().join(d))?;
        }
        git(
            dir.path(),
            &["init", "-q", "--bare", "-b", BRANCH, "repos/fleet.git"],
        )?;
        git(dir.path(), &["init", "-q", "-b", BRANCH, "work"])?;
        for (k, v) in [
            ("user.name", "netwave tests"),
            ("user.email", "tests@netwave.invalid"),
        ] {
            git(&work, &["config", k, v])?;
        }
        git(&work, &["remote", "add", "origin", "../repos/fleet.git"])?;

        let localhost = std::net::IpAddr::from([127, 0, 0, 1]);
        let git_port = free_port(localhost)?;
        let storage = free_port(localhost)?;
        let mut processes = vec![Supervised::spawn(
            &bin.join("git-http"),
            &[
                dir.path().join("repos").display().to_string(),
                format!("127.0.0.1:{git_port}"),
            ],
            &dir.path().join("git-http.log"),
            None,
            None,
        )?];
        let kubeconfig = format!("KUBECONFIG={}", hub.kubeconfig().display());
        let mut health = Vec::new();
        for (name, extra) in [
            (
                "source-controller",
                vec![
                    format!("--storage-path={}", dir.path().join("storage").display()),
                    format!("--storage-addr=127.0.0.1:{storage}"),
                    format!("--storage-adv-addr=127.0.0.1:{storage}"),
                ],
            ),
            (
                "kustomize-controller",
                vec![format!(
                    "--requeue-dependency={}ms",
                    requeue_dependency.as_millis()
                )],
            ),
        ] {
            let health_port = free_port(localhost)?;
            let mut args = vec![
                kubeconfig.clone(),
                bin.join(name).display().to_string(),
                format!("--metrics-addr=127.0.0.1:{}", free_port(localhost)?),
                format!("--health-addr=127.0.0.1:{health_port}"),
                "--log-level=info".to_string(),
            ];
            args.extend(extra);
            processes.push(Supervised::spawn(
                Path::new("/usr/bin/env"),
                &args,
                &dir.path().join(format!("{name}.log")),
                None,
                None,
            )?);
            health.push((name, health_port));
        }
        let mut flux = Flux {
            url: format!("http://127.0.0.1:{git_port}/fleet.git"),
            dir,
            processes,
        };
        for (i, (name, port)) in health.into_iter().enumerate() {
            flux.until_ready(i + 1, name, port).await?;
        }
        Ok(flux)
    }

    /// Waits until a controller (`self.processes[index]`) answers 200 on `/readyz`; fails at once if it
    /// exits.
    async fn until_ready(&mut self, index: usize, name: &str, port: u16) -> Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let mut answer = String::new();
            if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                let asked = s.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").await;
                if asked.is_ok() {
                    let _ = s.read_to_string(&mut answer).await;
                }
            }
            if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
                return Ok(());
            }
            if let Ok(Some(status)) = self.processes[index].watchdog.try_wait() {
                bail!("{name} exited ({status}):\n{}", self.log_tail(name, 30));
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "{name} is not ready after 60 s:\n{}",
                    self.log_tail(name, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The repository's URL, for a GitRepository's `spec.url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes `files` (path in the repository, content), commits them as one commit and pushes it;
    /// returns the commit's id.
    pub fn commit(&self, files: &[(String, String)], message: &str) -> Result<String> {
        let work = self.dir.path().join("work");
        for (path, content) in files {
            let p = work.join(path);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&p, content).with_context(|| format!("writing {}", p.display()))?;
        }
        git(&work, &["add", "-A"])?;
        git(&work, &["commit", "-q", "-m", message])?;
        git(&work, &["push", "-q", "origin", BRANCH])?;
        Ok(git(&work, &["rev-parse", "HEAD"])?.trim().to_string())
    }

    /// One process's log (`git-http`, `source-controller`, `kustomize-controller`).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// The last `lines` lines of one process's log.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = self.log(name);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// A kubeconfig for `cp`'s admin with the CA inlined, as a Kustomization's `kubeConfig.secretRef`
/// needs it (Flux reads it from a Secret's `value` key, never from the hub's file system).
pub fn remote_kubeconfig(cp: &ControlPlane) -> Result<String> {
    let ca = std::fs::read(cp.ca_path())?;
    let mut kc = cp.endpoint().kubeconfig(super::ADMIN_TOKEN);
    let cluster = &mut kc["clusters"][0]["cluster"];
    cluster
        .as_object_mut()
        .context("a kubeconfig's cluster is an object")?
        .remove("certificate-authority");
    // ByteString serializes as base64, as a kubeconfig's `*-data` fields are.
    cluster["certificate-authority-data"] = serde_json::to_value(k8s_openapi::ByteString(ca))?;
    Ok(serde_json::to_string_pretty(&kc)?)
}

/// Runs git in `dir`; its standard output.
fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
