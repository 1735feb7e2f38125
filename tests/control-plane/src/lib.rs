//! netwave-control-plane: the real Kubernetes control plane for netwave's tests — etcd and kube-apiserver
//! built from Go modules (`build.sh`, cached outside the repo), and a `kubectl` of the same release.
//!
//! ```text
//!  test ──kube::Client / kubectl──▶ kube-apiserver (127.0.0.1 or a fabric address, RBAC, token auth,
//!                                   │                our CA's serving cert, SA token signing)
//!                                   ▼
//!                                  etcd (127.0.0.1, temp dir, no fsync)
//! ```
//!
//! Each server runs under a small bash watchdog whose stdin is a pipe from the test process: when the
//! test process goes away — normal exit, panic, SIGKILL or Ctrl-C — the pipe closes and the watchdog
//! stops the server. So a test binary never leaves an API server behind, even through a `static`.
//!
//! Starting a control plane takes a few seconds, so a test binary shares one ([`shared`]): each test
//! takes it exclusively and it is reset (every object of netwave's API group, Nodes, Leases, Events and
//! admission policies deleted) before the next test gets it. A test that stops or restarts the server,
//! or needs it on another address, starts its own ([`ControlPlane::start`]).
//!
//! [`frr`]: a real FRR (zebra + bgpd) per network namespace, for the agent's FRR tests and the e2e fleet.
//! [`node`]: a real node (containerd, kubelet, kube-proxy, kube-controller-manager, kube-scheduler) beside
//! it, for the install tier.

pub mod flux;
pub mod frr;
pub mod host;
pub mod node;
pub mod poll;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, ResourceExt};

/// The bearer token of the built-in admin (group `system:masters`).
pub const ADMIN_TOKEN: &str = "netwave-admin-token";

/// The binaries `build.sh` produced (or reused) and what it says about them.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kubectl: PathBuf,
    /// The Prometheus operator's CRDs (PrometheusRule, ServiceMonitor) as its release ships them.
    pub prometheus_operator_crds: PathBuf,
    /// One line: versions, Go version, build time.
    pub info: String,
}

/// Builds or reuses the control-plane binaries, once per process. `NETWAVE_CONTROL_PLANE=<dir>` points at
/// prebuilt binaries instead (a developer machine without Go).
pub fn binaries() -> Result<&'static Binaries> {
    static BINARIES: OnceLock<std::result::Result<Binaries, String>> = OnceLock::new();
    BINARIES
        .get_or_init(|| find_or_build().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("the real control plane is not available: {e}"))
}

/// The kstatus and Argo CD health checker (`tests/gitops-health`: cli-utils' kstatus and health.lua in
/// gopher-lua), built or reused once per process by its `build.sh`.
pub fn gitops_health() -> Result<&'static Path> {
    static BINARY: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| built_by("../gitops-health/build.sh"))
        .as_deref()
        .map_err(|e| anyhow::anyhow!("the gitops-health checker is not available: {e}"))
}

/// Runs a build script (path relative to this crate) that prints the path of what it built or reused.
fn built_by(script: &str) -> std::result::Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn find_or_build() -> Result<Binaries> {
    let dir = match std::env::var_os("NETWAVE_CONTROL_PLANE") {
        Some(d) => PathBuf::from(d),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("build.sh");
            let out = Command::new("bash")
                .arg(&script)
                .stderr(Stdio::inherit())
                .output()
                .with_context(|| format!("running {}", script.display()))?;
            if !out.status.success() {
                bail!("{} failed ({})", script.display(), out.status);
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    let info = std::fs::read_to_string(dir.join("build-info"))
        .with_context(|| format!("reading {}/build-info", dir.display()))?
        .trim()
        .to_string();
    let prometheus_operator_crds = std::fs::read_dir(dir.join("crds"))
        .with_context(|| format!("reading {}/crds", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("prometheus-operator-"))
        })
        .with_context(|| format!("no prometheus-operator CRDs in {}/crds", dir.display()))?;
    let b = Binaries {
        prometheus_operator_crds,
        etcd: dir.join("etcd"),
        kube_apiserver: dir.join("kube-apiserver"),
        kubectl: dir.join("kubectl"),
        info,
    };
    for p in [&b.etcd, &b.kube_apiserver, &b.kubectl] {
        if !p.is_file() {
            bail!("{} is missing", p.display());
        }
    }
    eprintln!("control plane: {}", b.info);
    Ok(b)
}

/// How to start a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// The API server's address (default 127.0.0.1). The e2e fleet binds an address its network
    /// namespaces reach; the serving certificate always covers 127.0.0.1 and this address.
    pub bind: IpAddr,
    /// How long to wait for `/readyz`.
    pub start_timeout: Duration,
    /// Token users beside the admin, one `tokens.csv` line each (a benchmark tells its clients apart by
    /// user, in the audit log). Default: none.
    pub tokens: Vec<TokenUser>,
    /// Extra kube-apiserver flags, after the ones this crate sets (an audit policy, say). Default: none.
    pub apiserver_args: Vec<String>,
    /// Keep the ServiceAccount admission plugin on (pods get their tokens mounted). Off by default:
    /// without a kube-controller-manager nobody creates the `default` ServiceAccounts it requires.
    pub service_account_admission: bool,
}

/// A static-token user of the API server (`--token-auth-file`).
#[derive(Debug, Clone)]
pub struct TokenUser {
    pub token: String,
    pub user: String,
    pub groups: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            start_timeout: Duration::from_secs(90),
            tokens: Vec::new(),
            apiserver_args: Vec::new(),
            service_account_admission: false,
        }
    }
}

/// A running etcd + kube-apiserver in a temporary directory. Both stop when it is dropped.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    bin: &'static Binaries,
    opts: Options,
    etcd_url: String,
    addr: SocketAddr,
    etcd: Option<Supervised>,
    apiserver: Option<Supervised>,
    kubeconfig: PathBuf,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("addr", &self.addr)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver on free ports and waits until the API server is ready.
    pub async fn start(opts: Options) -> Result<ControlPlane> {
        let bin = binaries()?;
        let dir = tempfile::Builder::new()
            .prefix("netwave-control-plane-")
            .tempdir()
            .context("creating the control plane's directory")?;
        write_pki(dir.path(), opts.bind)?;
        let mut tokens = format!("{ADMIN_TOKEN},admin,admin,\"system:masters\"\n");
        for t in &opts.tokens {
            if [&t.token, &t.user]
                .iter()
                .any(|f| f.is_empty() || f.contains([',', '"', '\n']))
            {
                bail!(
                    "token user {:?}: token and user must be non-empty, without commas or quotes",
                    t.user
                );
            }
            // token,user,uid,"group1,group2"
            tokens.push_str(&format!(
                "{},{},{},\"{}\"\n",
                t.token,
                t.user,
                t.user,
                t.groups.join(",")
            ));
        }
        std::fs::write(dir.path().join("tokens.csv"), tokens)?;
        let kubeconfig = dir.path().join("kubeconfig");
        let mut cp = ControlPlane {
            dir,
            bin,
            opts,
            etcd_url: String::new(),
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            etcd: None,
            apiserver: None,
            kubeconfig,
        };
        cp.on_fresh_ports("etcd", async |cp| {
            let _ = std::fs::remove_dir_all(cp.dir.path().join("etcd"));
            cp.start_etcd().await
        })
        .await?;
        cp.on_fresh_ports("kube-apiserver", async |cp| {
            cp.addr = SocketAddr::new(cp.opts.bind, free_port(cp.opts.bind)?);
            cp.write_kubeconfig(&cp.kubeconfig, ADMIN_TOKEN)?;
            cp.start_apiserver().await
        })
        .await?;
        Ok(cp)
    }

    /// Runs `start`, which picks its ports with [`free_port`]: bound, released, then bound again by the
    /// server. Another process (test binaries run in parallel lanes) may take one in between; the server
    /// then exits at once, and `start` runs again on fresh ports, up to [`PORT_ATTEMPTS`] times.
    async fn on_fresh_ports(
        &mut self,
        server: &str,
        mut start: impl AsyncFnMut(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let mut attempt = 1;
        loop {
            match start(self).await {
                Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => {
                    eprintln!(
                        "control plane: {server}'s port was taken before it bound it; fresh ports"
                    );
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    async fn start_etcd(&mut self) -> Result<()> {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (client, peer) = (free_port(lo)?, free_port(lo)?);
        self.etcd_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let data = self.dir.path().join("etcd");
        let args: Vec<String> = vec![
            "--name=netwave".into(),
            format!("--data-dir={}", data.display()),
            // Test data: a crash loses nothing anyone needs, and fsync on a loaded CI disk costs seconds.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
            format!("--listen-client-urls={}", self.etcd_url),
            format!("--advertise-client-urls={}", self.etcd_url),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=netwave={peer_url}"),
        ];
        let log = self.dir.path().join("etcd.log");
        let mut etcd = Supervised::spawn(
            &self.bin.etcd,
            &args,
            &log,
            Some(self.dir.path()),
            Some("1"),
        )?;
        let listening = poll::until_send("etcd to listen", Duration::from_secs(30), || {
            let exited = etcd.exited();
            async move {
                if let Some(status) = exited {
                    bail!("etcd exited ({status}) before serving");
                }
                Ok(tokio::net::TcpStream::connect(("127.0.0.1", client))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string()))
            }
        })
        .await;
        if let Err(e) = listening {
            bail!("{e:#}:\n{}", tail(&log));
        }
        self.etcd = Some(etcd);
        Ok(())
    }

    fn apiserver_args(&self) -> Vec<String> {
        let d = self.dir.path();
        let p = |f: &str| d.join(f).display().to_string();
        let mut args = vec![
            format!("--etcd-servers={}", self.etcd_url),
            format!("--bind-address={}", self.addr.ip()),
            format!("--secure-port={}", self.addr.port()),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--cert-dir={}", p("pki")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            format!("--service-account-issuer=https://{}", self.addr),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--authorization-mode=Node,RBAC".into(),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--allow-privileged=true".into(),
            // The address must not land in Endpoints (and a loopback one is refused by the lease reconciler).
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
        ];
        if !self.opts.service_account_admission {
            // No controller-manager creates default ServiceAccounts; tests create the ones they use.
            // (A list flag: a later `--disable-admission-plugins=` would add to it, not replace it.)
            args.push("--disable-admission-plugins=ServiceAccount".into());
        }
        args.extend(self.opts.apiserver_args.iter().cloned());
        args
    }

    async fn start_apiserver(&mut self) -> Result<()> {
        let log = self.dir.path().join("apiserver.log");
        let started = Instant::now();
        let mut server = Supervised::spawn(
            &self.bin.kube_apiserver,
            &self.apiserver_args(),
            &log,
            None,
            None,
        )?;
        let client = self.client().await?;
        let timeout = self.opts.start_timeout.saturating_sub(started.elapsed());
        let client = &client;
        let ready = poll::until_send("kube-apiserver ready", timeout, || {
            let exited = server.exited();
            async move {
                if let Some(status) = exited {
                    bail!("kube-apiserver exited ({status}) before ready");
                }
                let req = http::Request::get("/readyz").body(Vec::new())?;
                Ok(match client.request_text(req).await {
                    Ok(body) if body.trim() == "ok" => Ok(()),
                    r => Err(format!("/readyz: {r:?}")),
                })
            }
        })
        .await;
        if let Err(e) = ready {
            bail!("{e:#}:\n{}", tail(&log));
        }
        eprintln!(
            "control plane: kube-apiserver ready on {} in {:.1} s",
            self.addr,
            started.elapsed().as_secs_f64()
        );
        self.apiserver = Some(server);
        Ok(())
    }

    /// Stops the API server (SIGTERM, as a rolling control-plane upgrade does); etcd keeps the data.
    pub fn stop_apiserver(&mut self) {
        if let Some(s) = self.apiserver.take() {
            s.stop();
        }
    }

    /// Starts the API server again on the same address and etcd.
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        self.stop_apiserver();
        self.start_apiserver().await
    }

    /// The kube-apiserver process's id (not its watchdog's), while it runs: for its RSS and CPU time.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref()?.server_pid("kube-apiserver")
    }

    /// The etcd process's id, while it runs.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.as_ref()?.server_pid("etcd")
    }

    /// etcd's client URL (plain HTTP on loopback; its `/metrics` too).
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The API server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin kubeconfig (token of `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The CA that signed the serving certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The API server's log (for a failing test's message).
    pub fn apiserver_log(&self) -> String {
        tail(&self.dir.path().join("apiserver.log"))
    }

    /// Writes a kubeconfig for this server that authenticates with `token`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<()> {
        let kc = self.endpoint().kubeconfig(token);
        std::fs::write(path, serde_json::to_vec_pretty(&kc)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Where this server is and the CA it is checked against: what a task that outlives a borrow of
    /// the control plane needs to make clients (a simulated kubelet minting tokens for new pods).
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            addr: self.addr,
            ca: self.ca_path(),
        }
    }

    /// An admin client (bound to the calling test's runtime).
    pub async fn client(&self) -> Result<Client> {
        self.client_from(&self.kubeconfig).await
    }

    /// A client that authenticates with `token` (a service-account token from TokenRequest, say).
    pub async fn client_with_token(&self, token: &str) -> Result<Client> {
        self.endpoint().client_with_token(token).await
    }

    async fn client_from(&self, path: &Path) -> Result<Client> {
        let kc = Kubeconfig::read_from(path)?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// The binaries and files this control plane runs from.
    pub fn binaries(&self) -> &'static Binaries {
        self.bin
    }

    /// `kubectl` of the server's release, with the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut c = Command::new(&self.bin.kubectl);
        c.env("KUBECONFIG", &self.kubeconfig)
            // A fresh discovery cache per call, never the user's: tests install CRDs and use them right
            // away, and a cached discovery from before the install would not know their kinds.
            .env(
                "KUBECACHEDIR",
                self.dir.path().join(format!("kubectl-cache-{n}")),
            )
            .env("HOME", self.dir.path());
        c
    }

    /// Applies CRDs (server-side, idempotent) and waits until every one is Established.
    pub async fn install_crds(
        &self,
        client: &Client,
        crds: impl IntoIterator<Item = CustomResourceDefinition>,
    ) -> Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let pp = PatchParams::apply("netwave-tests").force();
        let mut names = Vec::new();
        for mut crd in crds {
            crd.metadata.managed_fields = None;
            crd.metadata.resource_version = None;
            crd.status = None;
            let name = crd.name_any();
            api.patch(&name, &pp, &Patch::Apply(&crd))
                .await
                .with_context(|| format!("applying CRD {name}"))?;
            names.push(name);
        }
        let what = format!("CRDs {names:?} Established");
        let (api, names) = (&api, &names);
        poll::until_send(&what, Duration::from_secs(30), || async move {
            for name in names {
                let crd = api.get(name).await?;
                let established = crd
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                if !established {
                    return Ok(Err(format!("{name}: {:?}", crd.status)));
                }
            }
            Ok(Ok(()))
        })
        .await
    }

    /// Installs `crds` and waits until the API server validates with them (it does so a moment after
    /// they are Established): `dry_run`, a dry run of a write the old and new schemas tell apart,
    /// succeeds when `accepted`, else it is refused with a 422, whose message is returned.
    pub async fn install_crds_validating<F, Fut>(
        &self,
        client: &Client,
        crds: impl IntoIterator<Item = CustomResourceDefinition>,
        accepted: bool,
        dry_run: F,
    ) -> Result<String>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), kube::Error>>,
    {
        self.install_crds(client, crds).await?;
        poll::eventually(
            "the API server to validate with the installed CRDs",
            Duration::from_secs(60),
            || async {
                match (dry_run().await, accepted) {
                    (Ok(()), true) => Ok(String::new()),
                    (Err(kube::Error::Api(e)), false) if e.code == 422 => Ok(e.message),
                    (other, _) => Err(format!("{other:?}")),
                }
            },
        )
        .await
    }

    /// Deletes what tests create, so the next test starts from an empty cluster: every object of the
    /// `netwave.dev` kinds, Nodes, Leases and Events in every namespace but `kube-*`, and admission
    /// policies.
    /// Namespaces stay (without a controller-manager nothing would finalize their deletion).
    pub async fn reset(&self, client: &Client) -> Result<()> {
        let dp = DeleteParams::background();
        let lp = ListParams::default();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in crds.list(&lp).await?.items {
            // netwave's kinds are all cluster-scoped.
            if crd.spec.group != "netwave.dev" || crd.spec.scope != "Cluster" {
                continue;
            }
            let Some(v) = crd.spec.versions.iter().find(|v| v.served) else {
                continue;
            };
            let gvk = GroupVersionKind::gvk(&crd.spec.group, &v.name, &crd.spec.names.kind);
            let ar = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
            Api::<DynamicObject>::all_with(client.clone(), &ar)
                .delete_collection(&dp, &lp)
                .await
                .with_context(|| format!("deleting every {}", ar.kind))?;
        }
        use k8s_openapi::api::admissionregistration::v1 as adm;
        Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .delete_collection(&dp, &lp)
            .await
            .context("deleting every Node")?;
        Api::<adm::ValidatingAdmissionPolicyBinding>::all(client.clone())
            .delete_collection(&dp, &lp)
            .await
            .context("deleting every ValidatingAdmissionPolicyBinding")?;
        Api::<adm::ValidatingAdmissionPolicy>::all(client.clone())
            .delete_collection(&dp, &lp)
            .await
            .context("deleting every ValidatingAdmissionPolicy")?;
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        for ns in namespaces.list(&lp).await?.items {
            let ns = ns.name_any();
            // kube-system holds the API server's own identity Leases.
            if ns.starts_with("kube-") {
                continue;
            }
            let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
                Api::namespaced(client.clone(), &ns);
            leases.delete_collection(&dp, &lp).await?;
            let events: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(client.clone(), &ns);
            events.delete_collection(&dp, &lp).await?;
        }
        Ok(())
    }

    /// [`service_account_token`] on this server.
    pub async fn service_account_token(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
        pod: Option<&k8s_openapi::api::core::v1::Pod>,
    ) -> Result<String> {
        service_account_token(client, namespace, name, pod).await
    }

    /// An admin client on this server with `crds` installed and `namespace` created: what every suite
    /// that runs netwave against it starts from (idempotent, so tests sharing the server may all call it).
    pub async fn prepared(
        &self,
        crds: impl IntoIterator<Item = CustomResourceDefinition>,
        namespace: &str,
    ) -> Result<Client> {
        let client = self.client().await?;
        self.install_crds(&client, crds).await?;
        self.ensure_namespace(&client, namespace).await?;
        Ok(client)
    }

    /// Creates the namespace unless it exists.
    pub async fn ensure_namespace(&self, client: &Client, name: &str) -> Result<()> {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let ns = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(s) = self.apiserver.take() {
            s.stop();
        }
        if let Some(s) = self.etcd.take() {
            s.stop();
        }
    }
}

/// A server process under a bash watchdog. The watchdog's stdin is a pipe whose write end only this
/// process holds: closing it (drop, or this process ending in any way) makes the watchdog SIGTERM the
/// server, wait up to 10 s and SIGKILL it. Ctrl-C reaches the watchdog too and does the same.
struct Supervised {
    watchdog: Child,
    stdin: Option<ChildStdin>,
}

const WATCHDOG: &str = r#"
exec 3<&0
"$@" </dev/null & server=$!
stop() {
    kill -TERM "$server" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server" 2>/dev/null
    wait "$server"
    # The last server of a control plane removes its directory (a `static` never runs the destructor).
    [ -n "${REMOVE_DIR:-}" ] && rm -rf "$REMOVE_DIR"
    exit
}
trap stop TERM INT HUP
# Returns at EOF: the owner closed the pipe or is gone. If the server dies first, `wait -n` notices.
# (An asynchronous command's stdin would be /dev/null without the explicit redirection.)
read -r _ <&3 &
reader=$!
wait -n "$server" "$reader"
eof=$?
# A server that died on its own leaves its directory to the owner: its log is in it, and says why (a
# port taken between its pick and its bind is retried on what the log says).
kill -0 "$server" 2>/dev/null || REMOVE_DIR=
# At EOF (the owner went away rather than stopping us in order) etcd gives the API server a moment to stop
# first: an API server whose etcd is gone hangs in shutdown until it is killed.
if [ "$eof" -ne 0 ] && [ -n "${STOP_DELAY:-}" ] && kill -0 "$server" 2>/dev/null; then
    sleep "$STOP_DELAY"
fi
stop
"#;

impl Supervised {
    fn spawn(
        bin: &Path,
        args: &[String],
        log: &Path,
        remove_dir: Option<&Path>,
        stop_delay: Option<&str>,
    ) -> Result<Supervised> {
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        let mut watchdog = Command::new("bash")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("watchdog")
            .arg(bin)
            .args(args)
            .env("REMOVE_DIR", remove_dir.unwrap_or(Path::new("")))
            .env("STOP_DELAY", stop_delay.unwrap_or(""))
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdin = watchdog.stdin.take();
        Ok(Supervised { watchdog, stdin })
    }

    /// The server's process id: the watchdog's child whose command name is `comm` (its other child is a
    /// bash reading the pipe).
    fn server_pid(&self, comm: &str) -> Option<u32> {
        let parent = self.watchdog.id().to_string();
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
            let (head, rest) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1;
            let ppid = rest.split_whitespace().nth(1)?;
            (ppid == parent && name == comm).then_some(pid)
        })
    }

    /// The watchdog's exit status once the server (and so the watchdog) has gone.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.watchdog.try_wait().ok().flatten()
    }

    fn stop(mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(b"stop\n");
        }
        let _ = self.watchdog.wait();
    }
}

/// How often a control plane tries fresh ports when a server finds its port taken.
const PORT_ATTEMPTS: u32 = 3;

/// Whether a server failed to start only because its port was taken (its log tail is in the error).
fn port_taken(e: &anyhow::Error) -> bool {
    format!("{e:#}").contains("address already in use")
}

/// A server's address and CA ([`ControlPlane::endpoint`]): clients for any token, with no borrow of the
/// control plane.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub ca: PathBuf,
}

impl Endpoint {
    /// A kubeconfig for this server that authenticates with `token`.
    pub fn kubeconfig(&self, token: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "netwave", "cluster": {
                "server": format!("https://{}", self.addr),
                "certificate-authority": self.ca,
            }}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "netwave", "context": {"cluster": "netwave", "user": "user"}}],
            "current-context": "netwave",
        })
    }

    /// A client that authenticates with `token`.
    pub async fn client_with_token(&self, token: &str) -> Result<Client> {
        let kc: Kubeconfig = serde_json::from_value(self.kubeconfig(token))?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }
}

/// A token for a ServiceAccount from the TokenRequest API, valid for an hour. Bound to `pod` when given,
/// as the kubelet mounts it into the pod: the API server then records the pod's node in the requests
/// the token makes (`authentication.kubernetes.io/node-name`).
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    name: &str,
    pod: Option<&k8s_openapi::api::core::v1::Pod>,
) -> Result<String> {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    let request = TokenRequest {
        spec: TokenRequestSpec {
            bound_object_ref: pod.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(p.name_any()),
                uid: p.metadata.uid.clone(),
            }),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer: TokenRequest =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), namespace)
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .with_context(|| format!("TokenRequest for ServiceAccount {namespace}/{name}"))?;
    Ok(answer.status.context("TokenRequest without status")?.token)
}

/// An exclusive lock on `$TMPDIR/<file>`, shared by every process of this machine and released by the
/// kernel when the returned file is dropped or the process ends, however it ends. Waits (saying so, as
/// `who`) while another process holds it.
pub async fn machine_lock(file: &str, who: &'static str) -> Result<std::fs::File> {
    let path = std::env::temp_dir().join(file);
    tokio::task::spawn_blocking(move || -> Result<std::fs::File> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if f.try_lock().is_err() {
            eprintln!(
                "{who}: waiting for another process to end (lock {})",
                path.display()
            );
            f.lock()
                .with_context(|| format!("locking {}", path.display()))?;
        }
        Ok(f)
    })
    .await?
}

/// A free TCP port on `ip` (bound and released; a race with another process is possible but rare).
pub fn free_port(ip: IpAddr) -> Result<u16> {
    Ok(std::net::TcpListener::bind((ip, 0))
        .with_context(|| format!("binding {ip}:0"))?
        .local_addr()?
        .port())
}

/// A CA, a serving certificate for 127.0.0.1, `localhost` and `bind`, and the service-account key.
fn write_pki(dir: &Path, bind: IpAddr) -> Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "netwave test CA");
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()])?;
    leaf.distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    leaf.subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    if !bind.is_loopback() {
        leaf.subject_alt_names.push(SanType::IpAddress(bind));
    }
    // The `kubernetes` Service (first address of --service-cluster-ip-range), as pods on a real node
    // reach the API server: in-cluster clients check the certificate against it.
    leaf.subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
    for name in ["kubernetes", "kubernetes.default", "kubernetes.default.svc"] {
        leaf.subject_alt_names
            .push(SanType::DnsName(name.try_into()?));
    }
    let cert = leaf.signed_by(&key, &issuer)?;

    let sa = KeyPair::generate()?;
    std::fs::write(dir.join("ca.crt"), ca_cert.pem())?;
    std::fs::write(dir.join("apiserver.crt"), cert.pem())?;
    std::fs::write(dir.join("apiserver.key"), key.serialize_pem())?;
    std::fs::write(dir.join("sa.key"), sa.serialize_pem())?;
    // The verifying side reads public keys only.
    std::fs::write(dir.join("sa.pub"), sa.public_key_pem())?;
    Ok(())
}

/// The last 40 lines of a log file.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The control plane this test binary shares, taken exclusively until the returned guard drops.
pub struct Shared {
    cp: Option<ControlPlane>,
}

impl std::ops::Deref for Shared {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        self.cp.as_ref().expect("present until drop")
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(cp) = self.cp.take() {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            pool.idle.push(cp);
        }
    }
}

struct Pool {
    idle: Vec<ControlPlane>,
    started: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    idle: Vec::new(),
    started: 0,
});

/// How many control planes one test binary may run at once (`NETWAVE_CONTROL_PLANES`, default 2: the
/// tests of a binary run two at a time on these 2-core machines).
fn pool_size() -> usize {
    std::env::var("NETWAVE_CONTROL_PLANES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(2)
}

/// Takes one of this test binary's control planes, starting it on first use, reset to an empty cluster.
/// Tests waiting for one queue here, so tests of one binary are isolated from each other.
pub async fn shared() -> Result<Shared> {
    let cp = loop {
        let start_new = {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(cp) = pool.idle.pop() {
                break cp;
            }
            if pool.started < pool_size() {
                pool.started += 1;
                true
            } else {
                false
            }
        };
        if start_new {
            match ControlPlane::start(Options::default()).await {
                Ok(cp) => break cp,
                Err(e) => {
                    POOL.lock().unwrap_or_else(|p| p.into_inner()).started -= 1;
                    return Err(e);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let shared = Shared { cp: Some(cp) };
    let client = shared.client().await?;
    shared
        .reset(&client)
        .await
        .context("resetting the shared control plane")?;
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Options::tokens` and `Options::apiserver_args` reach the API server: a request of the extra user
    /// lands in the audit log the extra flags ask for, under that user's name; the pids found are the
    /// servers'.
    #[tokio::test]
    async fn extra_token_users_and_flags_reach_the_api_server() {
        let dir = tempfile::tempdir().unwrap();
        let (policy, log) = (dir.path().join("policy.yaml"), dir.path().join("audit.log"));
        std::fs::write(
            &policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  users: [\"alice\"]\n- level: None\n",
        )
        .unwrap();
        let cp = ControlPlane::start(Options {
            tokens: vec![TokenUser {
                token: "alice-token".into(),
                user: "alice".into(),
                groups: vec!["system:masters".into()],
            }],
            apiserver_args: vec![
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", log.display()),
            ],
            ..Default::default()
        })
        .await
        .unwrap();
        let alice = cp.client_with_token("alice-token").await.unwrap();
        Api::<k8s_openapi::api::core::v1::Node>::all(alice)
            .list(&ListParams::default())
            .await
            .unwrap();
        let audit = std::fs::read_to_string(&log).unwrap();
        assert!(
            audit
                .lines()
                .any(|l| l.contains(r#""username":"alice""#) && l.contains(r#""resource":"nodes""#)),
            "no audit event of alice listing nodes:\n{audit}"
        );
        for (pid, comm) in [
            (cp.apiserver_pid(), "kube-apiserver"),
            (cp.etcd_pid(), "etcd"),
        ] {
            let pid = pid.unwrap_or_else(|| panic!("no pid for {comm}"));
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
            assert_eq!(name.trim(), comm);
        }
    }
}
