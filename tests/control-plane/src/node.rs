//! A real Kubernetes node beside the control plane, for the install tier (DESIGN §7, tier 5): netwave's
//! images run as users run them, a DaemonSet and a Deployment on a kubelet, every component under its
//! own identity.
//!
//! ```text
//!  root ns:  etcd, kube-apiserver (198.19.0.254, NodeRestriction, Node+RBAC), kube-controller-manager,
//!            kube-scheduler                                  │ veth nwreal0 ⇄ eth0
//!  node ns:  containerd + runc, kubelet (node-ip 198.19.0.1), kube-proxy (nftables), CNI bridge cni0
//!            (10.244.0.0/24); hostNetwork pods (the agent) share this namespace, so whatever the agent
//!            configures lands here, never in the host's own network
//! ```
//!
//! Identities (static tokens, the bootstrap RBAC alone): `system:node:<name>` in `system:nodes` (the Node
//! authorizer and NodeRestriction check it), `system:kube-controller-manager` (with per-controller service
//! account credentials), `system:kube-scheduler`, `system:kube-proxy`. Nothing in the netwave path uses
//! the admin token: pods get kubelet-mounted, pod-bound service-account tokens.
//!
//! One kubelet per machine (it has fixed paths: `/var/lib/kubelet/device-plugins`, `/run/containerd`,
//! `/var/lib/cni`), so [`Cluster::start`] holds a machine-wide lock until the cluster is dropped. Dropping
//! it deletes the pods (so containerd's shims end), stops every process it started, unmounts what the
//! kubelet mounted under its directory, removes the pod cgroups and the namespace (with its nft tables,
//! bridge and routes): the host is left as it was, and a second run in the same machine starts clean.

use std::collections::BTreeMap;
use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};

use crate::{
    ControlPlane, Options, Supervised, TokenUser, binaries, free_port, machine_lock, tail,
};

/// The node's network namespace (one per machine: see the module docs).
pub const NETNS: &str = "netwave-real-node";
/// The API server's address (root-namespace end of the veth) and the node's.
pub const API_ADDR: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 254);
pub const NODE_ADDR: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
/// The pod network on the node's CNI bridge.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The sandbox ("pause") image: a static busybox that sleeps, built here (nothing is ever pulled).
pub const PAUSE_IMAGE: &str = "localhost/netwave-test-pause:1";
const ROOT_VETH: &str = "nwreal0";
/// Host paths the kubelet, containerd and CNI use whatever they are told (see the module docs): removed
/// on teardown when this cluster created them.
const FIXED_HOST_PATHS: [&str; 3] = ["/var/lib/kubelet", "/var/lib/cni", "/run/containerd"];
const LOCK_FILE: &str = "netwave-real-node.lock";

/// An OCI image layout (`make images` writes them to target/images/<name>/) and the repository name its
/// tags are imported under (the layout carries only the tag, e.g. `v0.1.0`).
#[derive(Debug, Clone)]
pub struct OciImage {
    pub layout: PathBuf,
    pub name: String,
}

/// How to start a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The node's name.
    pub node: String,
    /// Taints the kubelet registers the Node with (`key=value:Effect`), as a fleet's nodes are
    /// provisioned.
    pub taints: Vec<String>,
    /// Images imported into containerd before the kubelet starts (pods use `imagePullPolicy: Never`).
    pub images: Vec<OciImage>,
    /// How long to wait for the Node to become Ready.
    pub ready_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            node: "node-real".into(),
            taints: Vec::new(),
            images: Vec::new(),
            ready_timeout: Duration::from_secs(120),
        }
    }
}

/// A control plane plus one real node. See the module docs.
pub struct Cluster {
    // Field order is drop order for what `Drop` does not stop itself: the control plane goes last.
    procs: Vec<(&'static str, Supervised)>,
    /// Those of [`FIXED_HOST_PATHS`] that did not exist before this cluster.
    created_host_paths: Vec<&'static str>,
    /// The pod network namespaces (`cni-…`) that existed before: the others are this cluster's.
    netns_before: Vec<String>,
    dir: tempfile::TempDir,
    node: String,
    pub cp: ControlPlane,
    _lock: fs::File,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.node)
            .field("dir", &self.dir.path())
            .finish()
    }
}

/// Runs a command that must succeed.
fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ctr` against the containerd listening on `sock`, in namespace k8s.io.
fn ctr_at(sock: &Path, args: &[&str]) -> Result<String> {
    run(Command::new("ctr")
        .arg("--address")
        .arg(sock)
        .args(["-n", "k8s.io"])
        .args(args))
}

fn ip(args: &[&str]) -> Result<String> {
    run(Command::new("ip").args(args))
}

/// The tools a real node needs, or an error naming them (`tools/deps.sh cluster` installs them).
pub fn missing_tools() -> Vec<&'static str> {
    let on_path = |t: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
    };
    let mut missing: Vec<&'static str> = [
        "containerd",
        "ctr",
        "runc",
        "nft",
        "iptables",
        "buildah",
        "nsenter",
    ]
    .into_iter()
    .filter(|t| !on_path(t))
    .collect();
    if !Path::new("/usr/lib/cni/bridge").is_file() {
        missing.push("/usr/lib/cni/bridge");
    }
    missing
}

impl Cluster {
    /// Starts the control plane and the node, imports the images, and waits until the Node is Ready and
    /// the default service account and root CA exist (a pod can then be created anywhere).
    pub async fn start(opts: ClusterOptions) -> Result<Cluster> {
        let missing = missing_tools();
        if !missing.is_empty() {
            bail!(
                "a real node needs {} (tools/deps.sh cluster installs them)",
                missing.join(", ")
            );
        }
        let bin = binaries()?;
        let node_bins = NodeBinaries::find(&bin.kube_apiserver)?;
        // One kubelet per machine.
        let lock = machine_lock(LOCK_FILE, "real node").await?;
        let t0 = Instant::now();
        teardown_leftovers();
        let dir = tempfile::Builder::new()
            .prefix("netwave-real-node-")
            .tempdir()
            .context("creating the node's directory")?;
        check_free_space(dir.path())?;
        wire_netns()?;
        // Every request a service account makes, with the answer's code: what [`Cluster::refused`] reads.
        let audit_policy = dir.path().join("audit-policy.yaml");
        fs::write(
            &audit_policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             - level: Metadata\n  userGroups: [\"system:serviceaccounts\"]\n- level: None\n",
        )?;

        let tokens = Identities::new(&opts.node);
        let cp = ControlPlane::start(Options {
            bind: IpAddr::V4(API_ADDR),
            tokens: tokens.users(),
            // What a cluster runs: ServiceAccount admission mounts the pods' tokens, NodeRestriction keeps
            // each kubelet to its own Node and pods.
            service_account_admission: true,
            apiserver_args: vec![
                "--enable-admission-plugins=NodeRestriction".into(),
                // The `kubernetes` Service's endpoint: pods reach the API server through 10.0.0.1.
                "--endpoint-reconciler-type=lease".into(),
                format!("--advertise-address={API_ADDR}"),
                "--kubelet-preferred-address-types=InternalIP".into(),
                format!("--audit-policy-file={}", audit_policy.display()),
                format!(
                    "--audit-log-path={}",
                    dir.path().join("audit.log").display()
                ),
            ],
            ..Options::default()
        })
        .await?;
        let mut cluster = Cluster {
            procs: Vec::new(),
            created_host_paths: FIXED_HOST_PATHS
                .into_iter()
                .filter(|p| !Path::new(p).exists())
                .collect(),
            netns_before: pod_netns(),
            dir,
            node: opts.node.clone(),
            cp,
            _lock: lock,
        };
        cluster.start_components(&node_bins, &tokens, &opts).await?;
        eprintln!(
            "real node: {} Ready, cluster up in {:.1} s",
            opts.node,
            t0.elapsed().as_secs_f64()
        );
        Ok(cluster)
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Starts `bin args…` under the control plane's watchdog (in the node's namespace when `in_node`).
    fn spawn(
        &mut self,
        name: &'static str,
        in_node: bool,
        bin: &Path,
        args: &[String],
    ) -> Result<()> {
        let log = self.path(&format!("{name}.log"));
        let proc = if in_node {
            // nsenter --net, not `ip netns exec`: that one also gives each process a mount namespace of
            // its own, and the kubelet's volume mounts (service-account tokens, ConfigMaps) would then be
            // invisible to containerd, which bind-mounts them into the containers.
            let mut full: Vec<String> = vec![
                format!("--net=/run/netns/{NETNS}"),
                bin.display().to_string(),
            ];
            full.extend(args.iter().cloned());
            Supervised::spawn(Path::new("nsenter"), &full, &log, None, None)?
        } else {
            Supervised::spawn(bin, args, &log, None, None)?
        };
        self.procs.push((name, proc));
        Ok(())
    }

    async fn start_components(
        &mut self,
        bins: &NodeBinaries,
        ids: &Identities,
        opts: &ClusterOptions,
    ) -> Result<()> {
        let cp_dir = self.cp.dir.path().to_path_buf();
        for (name, token) in ids.kubeconfigs() {
            self.cp
                .write_kubeconfig(&self.path(&format!("{name}.kubeconfig")), &token)?;
        }
        // Control-plane controllers, in the root namespace.
        let kcm = self.path("kcm.kubeconfig").display().to_string();
        let kcm_port = free_port(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        self.spawn(
            "kube-controller-manager",
            false,
            &bins.kcm,
            &[
                format!("--kubeconfig={kcm}"),
                format!("--authentication-kubeconfig={kcm}"),
                format!("--authorization-kubeconfig={kcm}"),
                "--leader-elect=false".into(),
                "--use-service-account-credentials=true".into(),
                format!(
                    "--service-account-private-key-file={}",
                    cp_dir.join("sa.key").display()
                ),
                format!("--root-ca-file={}", cp_dir.join("ca.crt").display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={kcm_port}"),
                "--controllers=*".into(),
            ],
        )?;
        let sched = self.path("sched.kubeconfig").display().to_string();
        let sched_port = free_port(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        self.spawn(
            "kube-scheduler",
            false,
            &bins.scheduler,
            &[
                format!("--kubeconfig={sched}"),
                format!("--authentication-kubeconfig={sched}"),
                format!("--authorization-kubeconfig={sched}"),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={sched_port}"),
            ],
        )?;

        // The node: containerd first, then the images, then the kubelet and kube-proxy.
        self.write_node_config(opts)?;
        self.spawn(
            "containerd",
            true,
            Path::new("/usr/bin/containerd"),
            &[format!(
                "--config={}",
                self.path("containerd.toml").display()
            )],
        )?;
        let sock = self.path("containerd.sock");
        self.wait_for("containerd", Duration::from_secs(30), || {
            let ok = ctr_at(&sock, &["version"]).is_ok();
            async move { Ok(ok) }
        })
        .await?;
        let t = Instant::now();
        let pause = self.build_pause_image()?;
        self.import(&pause, None)?;
        for image in &opts.images {
            let archive = self.path(&format!(
                "{}.oci.tar",
                image
                    .layout
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
            ));
            run(Command::new("tar")
                .arg("-C")
                .arg(&image.layout)
                .arg("-cf")
                .arg(&archive)
                .arg("."))?;
            self.import(&archive, Some(&image.name))?;
        }
        eprintln!(
            "real node: {} image(s) imported in {:.1} s",
            opts.images.len() + 1,
            t.elapsed().as_secs_f64()
        );

        let mut kubelet = vec![
            format!("--config={}", self.path("kubelet.yaml").display()),
            format!("--kubeconfig={}", self.path("kubelet.kubeconfig").display()),
            format!("--root-dir={}", self.path("kubelet").display()),
            format!("--cert-dir={}", self.path("kubelet-pki").display()),
            format!("--hostname-override={}", opts.node),
            format!("--node-ip={NODE_ADDR}"),
        ];
        if !opts.taints.is_empty() {
            kubelet.push(format!("--register-with-taints={}", opts.taints.join(",")));
        }
        self.spawn("kubelet", true, &bins.kubelet, &kubelet)?;
        self.spawn(
            "kube-proxy",
            true,
            &bins.proxy,
            &[format!(
                "--config={}",
                self.path("kube-proxy.yaml").display()
            )],
        )?;

        let client = self.cp.client().await?;
        let node = opts.node.clone();
        self.wait_for("the Node to be Ready", opts.ready_timeout, || {
            let (client, node) = (client.clone(), node.clone());
            async move {
                let Ok(n) = Api::<Node>::all(client).get(&node).await else {
                    return Ok(false);
                };
                Ok(n.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True"))
            }
        })
        .await?;
        self.wait_for(
            "the default service account and kube-root-ca.crt",
            Duration::from_secs(60),
            || {
                let client = client.clone();
                async move {
                    let sa = Api::<ServiceAccount>::namespaced(client.clone(), "default")
                        .get_opt("default")
                        .await?;
                    let ca = Api::<ConfigMap>::namespaced(client, "default")
                        .get_opt("kube-root-ca.crt")
                        .await?;
                    Ok(sa.is_some() && ca.is_some())
                }
            },
        )
        .await
    }

    /// Polls `check` until it says true, failing with the components' logs when `timeout` passes or a
    /// component exits.
    async fn wait_for<F, Fut>(&mut self, what: &str, timeout: Duration, mut check: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let dir = self.dir.path().to_path_buf();
        let procs = &mut self.procs;
        let waited = crate::poll::until_send(what, timeout, || {
            let exited = procs.iter_mut().find_map(|(name, p)| {
                let status = p.exited()?;
                let log = tail(&dir.join(format!("{name}.log")));
                Some(format!("{name} exited ({status}):\n{log}"))
            });
            let answer = check();
            async move {
                if let Some(exited) = exited {
                    bail!("{exited}");
                }
                Ok(match answer.await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err("not yet".to_string()),
                    Err(e) => Err(format!("{e:#}")),
                })
            }
        })
        .await;
        waited.map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.logs_tail(15)))
    }

    /// The last lines of every component's log.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for (name, _) in &self.procs {
            let text =
                fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {name}\n"));
            for l in &all[all.len().saturating_sub(lines)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Every request a service account of `namespace` made that the API server refused (403: RBAC, the
    /// Node authorizer or an admission policy), one line each (`user verb resource/name: message`), read
    /// from the API server's audit log: what no component's own log can hide.
    pub fn refused(&self, namespace: &str) -> Vec<String> {
        self.refused_at(namespace)
            .into_iter()
            .map(|(_, line)| line)
            .collect()
    }

    /// [`Cluster::refused`], each with when the API server answered (unix seconds).
    pub fn refused_at(&self, namespace: &str) -> Vec<(f64, String)> {
        let prefix = format!("system:serviceaccount:{namespace}:");
        let text = fs::read_to_string(self.path("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["responseStatus"]["code"].as_u64() == Some(403))
            .filter(|e| {
                e["user"]["username"]
                    .as_str()
                    .is_some_and(|u| u.starts_with(&prefix))
            })
            .map(|e| {
                let o = &e["objectRef"];
                let at = e["stageTimestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                    .map_or(0.0, |t| t.as_millisecond() as f64 / 1000.0);
                let line = format!(
                    "{} {} {}{}/{}: {}",
                    e["user"]["username"].as_str().unwrap_or_default(),
                    e["verb"].as_str().unwrap_or_default(),
                    o["resource"].as_str().unwrap_or_default(),
                    o["subresource"]
                        .as_str()
                        .map(|s| format!("/{s}"))
                        .unwrap_or_default(),
                    o["name"].as_str().unwrap_or_default(),
                    e["responseStatus"]["message"].as_str().unwrap_or_default()
                );
                (at, line)
            })
            .collect()
    }

    /// A directory of this cluster's own, removed with it (a hostPath for a test's pods, say).
    pub fn scratch_dir(&self, name: &str) -> PathBuf {
        self.path(name)
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// An admin client (for the test's own checks and the install, as an admin runs `kubectl apply`).
    pub async fn admin(&self) -> Result<Client> {
        self.cp.client().await
    }

    /// The log of a pod's container as the kubelet wrote it (`kubectl logs` without the kubelet's
    /// serving certificate). Empty when the container has not started.
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> String {
        let prefix = format!("{namespace}_{pod}_");
        let Ok(dirs) = fs::read_dir(self.path("pod-logs")) else {
            return String::new();
        };
        let mut out = String::new();
        for d in dirs.flatten() {
            if !d.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let mut files: Vec<PathBuf> = fs::read_dir(d.path().join(container))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect();
            files.sort();
            for f in files {
                out.push_str(&fs::read_to_string(f).unwrap_or_default());
            }
        }
        out
    }

    /// Every pod of `namespace` whose containers the kubelet has logged for, deleted ones included (their
    /// logs stay until the cluster is dropped), sorted: what [`Cluster::container_log`] can read.
    pub fn logged_pods(&self, namespace: &str) -> Vec<String> {
        let prefix = format!("{namespace}_");
        let mut pods: Vec<String> = fs::read_dir(self.path("pod-logs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|d| {
                // <namespace>_<pod>_<uid>: neither a namespace nor a pod name has an underscore.
                let name = d.file_name().to_string_lossy().into_owned();
                let rest = name.strip_prefix(&prefix)?;
                rest.rsplit_once('_').map(|(pod, _)| pod.to_string())
            })
            .collect();
        pods.sort();
        pods.dedup();
        pods
    }

    /// `ctr` against this node's containerd, in namespace k8s.io.
    fn ctr(&self, args: &[&str]) -> Result<String> {
        ctr_at(&self.path("containerd.sock"), args)
    }

    fn import(&self, archive: &Path, base_name: Option<&str>) -> Result<()> {
        let mut args = vec!["images", "import"];
        if let Some(b) = base_name {
            args.extend(["--base-name", b]);
        }
        let a = archive.display().to_string();
        args.push(&a);
        self.ctr(&args)
            .with_context(|| format!("importing {a} into containerd"))?;
        Ok(())
    }

    /// The sandbox image: a static busybox sleeping, as an OCI archive built with buildah.
    fn build_pause_image(&self) -> Result<PathBuf> {
        let busybox = Path::new("/bin/busybox");
        let archive = self.path("pause.oci.tar");
        let storage = self.path("buildah");
        let b = |args: &[&str]| {
            run(Command::new("buildah")
                .arg("--root")
                .arg(storage.join("root"))
                .arg("--runroot")
                .arg(storage.join("run"))
                .args(["--storage-driver", "vfs"])
                .args(args))
        };
        let c = b(&["from", "scratch"])?.trim().to_string();
        b(&["copy", &c, &busybox.display().to_string(), "/bin/busybox"])?;
        b(&[
            "config",
            "--entrypoint",
            r#"["/bin/busybox","sleep","2147483647"]"#,
            &c,
        ])?;
        b(&[
            "commit",
            "--quiet",
            &c,
            &format!("oci-archive:{}:{PAUSE_IMAGE}", archive.display()),
        ])?;
        b(&["rm", &c])?;
        let _ = fs::remove_dir_all(&storage);
        Ok(archive)
    }

    fn write_node_config(&self, opts: &ClusterOptions) -> Result<()> {
        let d = self.dir.path();
        for sub in [
            "containerd/root",
            "containerd/state",
            "kubelet",
            "pod-logs",
            "cni/conf",
            "cni/ipam",
        ] {
            fs::create_dir_all(d.join(sub))?;
        }
        let p = |s: &str| d.join(s).display().to_string();
        fs::write(
            d.join("containerd.toml"),
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE in this machine's bounding set: runc cannot lower oom_score_adj otherwise.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
                root = p("containerd/root"),
                state = p("containerd/state"),
                sock = p("containerd.sock"),
                cni = p("cni/conf"),
            ),
        )?;
        fs::write(
            d.join("cni/conf/10-netwave.conflist"),
            serde_json::to_string_pretty(&serde_json::json!({
                "cniVersion": "0.4.0",
                "name": "netwave-real-node",
                "plugins": [
                    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
                     "hairpinMode": true,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": p("cni/ipam")}},
                    {"type": "portmap", "capabilities": {"portMappings": true}},
                    {"type": "loopback"}
                ]
            }))?,
        )?;
        // cgroups v1 and no systemd here: kubelet 1.37 refuses v1 unless told, with the cgroupfs driver.
        fs::write(
            d.join("kubelet.yaml"),
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://{sock}
address: {NODE_ADDR}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
podLogsDir: {logs}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
authorization:
  mode: Webhook
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
maxPods: 30
serializeImagePulls: false
volumePluginDir: {plugins}
# No KUBE-FIREWALL chains (they would drop non-loopback traffic to 127/8 in the node's namespace).
makeIPTablesUtilChains: false
shutdownGracePeriod: 0s
"#,
                sock = p("containerd.sock"),
                logs = p("pod-logs"),
                plugins = p("kubelet-plugins"),
            ),
        )?;
        fs::write(
            d.join("kube-proxy.yaml"),
            format!(
                r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kc}}}
mode: nftables
hostnameOverride: {node}
clusterCIDR: {POD_CIDR}
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
nodePortAddresses: ["127.0.0.1/32"]
"#,
                kc = p("proxy.kubeconfig"),
                node = opts.node,
            ),
        )?;
        Ok(())
    }

    /// Deletes every pod (so the kubelet stops their containers and containerd's shims end) and waits
    /// until none is left or `timeout` passes.
    async fn delete_pods(&self, timeout: Duration) {
        let Ok(client) = self.cp.client().await else {
            return;
        };
        let pods: Api<Pod> = Api::all(client.clone());
        let Ok(list) = pods.list(&ListParams::default()).await else {
            return;
        };
        for p in &list.items {
            let (Some(ns), Some(name)) = (&p.metadata.namespace, &p.metadata.name) else {
                continue;
            };
            let _ = Api::<Pod>::namespaced(client.clone(), ns)
                .delete(name, &DeleteParams::default().grace_period(1))
                .await;
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match pods.list(&ListParams::default()).await {
                Ok(l) if l.items.is_empty() => return,
                Err(_) => return,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Stops the cluster and leaves the host as it was (see the module docs). Also done on drop, without
    /// the graceful pod deletion.
    pub async fn stop(mut self) {
        // Workloads' controllers would recreate the pods: stop them first.
        if let Some(i) = self
            .procs
            .iter()
            .position(|(n, _)| *n == "kube-controller-manager")
        {
            let (_, p) = self.procs.remove(i);
            p.stop();
        }
        self.delete_pods(Duration::from_secs(30)).await;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // containerd's shims outlive containerd: kill and delete the tasks while it still runs.
        if let Ok(tasks) = self.ctr(&["tasks", "ls", "-q"]) {
            for id in tasks.lines() {
                let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
            }
            std::thread::sleep(Duration::from_millis(500));
            for id in tasks.lines() {
                let _ = self.ctr(&["tasks", "delete", "-f", id]);
            }
        }
        // kube-proxy, kubelet, containerd, then the controllers, in reverse start order.
        while let Some((_, p)) = self.procs.pop() {
            p.stop();
        }
        unmount_under(self.dir.path());
        remove_pod_cgroups();
        // Pods killed rather than deleted leave their network namespaces (CNI DEL never ran).
        for ns in pod_netns() {
            if !self.netns_before.contains(&ns) {
                let _ = ip(&["netns", "del", &ns]);
            }
        }
        for p in &self.created_host_paths {
            let _ = fs::remove_dir_all(p);
        }
        let _ = ip(&["netns", "del", NETNS]);
        let _ = ip(&["link", "del", ROOT_VETH]);
    }
}

/// The node's binaries, built by `build.sh` beside kube-apiserver.
struct NodeBinaries {
    kcm: PathBuf,
    scheduler: PathBuf,
    kubelet: PathBuf,
    proxy: PathBuf,
}

impl NodeBinaries {
    fn find(apiserver: &Path) -> Result<NodeBinaries> {
        let dir = apiserver
            .parent()
            .context("kube-apiserver has a directory")?;
        let b = NodeBinaries {
            kcm: dir.join("kube-controller-manager"),
            scheduler: dir.join("kube-scheduler"),
            kubelet: dir.join("kubelet"),
            proxy: dir.join("kube-proxy"),
        };
        for p in [&b.kcm, &b.scheduler, &b.kubelet, &b.proxy] {
            if !p.is_file() {
                bail!(
                    "{} is missing (tests/control-plane/build.sh builds it)",
                    p.display()
                );
            }
        }
        Ok(b)
    }
}

/// The static-token identities of the cluster's own components.
struct Identities {
    node: String,
    by_name: BTreeMap<&'static str, (String, String, Vec<String>)>,
}

impl Identities {
    fn new(node: &str) -> Identities {
        let mut by_name = BTreeMap::new();
        let mut add = |name: &'static str, user: String, groups: &[&str]| {
            let token = format!("netwave-real-node-{name}-token");
            by_name.insert(
                name,
                (token, user, groups.iter().map(|g| g.to_string()).collect()),
            );
        };
        add("kubelet", format!("system:node:{node}"), &["system:nodes"]);
        add("kcm", "system:kube-controller-manager".into(), &[]);
        add("sched", "system:kube-scheduler".into(), &[]);
        add("proxy", "system:kube-proxy".into(), &[]);
        Identities {
            node: node.to_string(),
            by_name,
        }
    }

    fn users(&self) -> Vec<TokenUser> {
        self.by_name
            .values()
            .map(|(token, user, groups)| TokenUser {
                token: token.clone(),
                user: user.clone(),
                groups: groups.clone(),
            })
            .collect()
    }

    /// (kubeconfig name, token) per component.
    fn kubeconfigs(&self) -> Vec<(&'static str, String)> {
        let _ = &self.node;
        self.by_name
            .iter()
            .map(|(name, (token, _, _))| (*name, token.clone()))
            .collect()
    }
}

/// Free space a node needs: containerd unpacks the images under the cluster's directory (~0.5 GB for
/// netwave's three), and a nearly full disk makes the kubelet evict pods, which a test would then report
/// as netwave's failure.
const MIN_FREE_BYTES: u64 = 3 << 30;

/// Fails at once, naming the numbers, when `dir`'s filesystem has less than [`MIN_FREE_BYTES`] free.
fn check_free_space(dir: &Path) -> Result<()> {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(dir)
        .output()
        .context("df")?;
    let avail: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .with_context(|| {
            format!(
                "df {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    if avail < MIN_FREE_BYTES {
        bail!(
            "only {:.1} GiB free on the filesystem of {}: a real node needs at least {} GiB (containerd \
             unpacks the images there; a full disk makes the kubelet evict pods)",
            avail as f64 / f64::from(1u32 << 30),
            dir.display(),
            MIN_FREE_BYTES >> 30
        );
    }
    Ok(())
}

/// The node's namespace wired to the root namespace: veth, addresses, routes, forwarding for the pods.
fn wire_netns() -> Result<()> {
    ip(&["netns", "add", NETNS])?;
    ip(&[
        "link", "add", ROOT_VETH, "type", "veth", "peer", "name", "eth0", "netns", NETNS,
    ])?;
    ip(&["addr", "add", &format!("{API_ADDR}/24"), "dev", ROOT_VETH])?;
    ip(&["link", "set", ROOT_VETH, "up"])?;
    let n = |args: &[&str]| {
        let mut full = vec!["-n", NETNS];
        full.extend_from_slice(args);
        ip(&full)
    };
    n(&["link", "set", "lo", "up"])?;
    n(&["addr", "add", &format!("{NODE_ADDR}/24"), "dev", "eth0"])?;
    n(&["link", "set", "eth0", "up"])?;
    n(&["route", "add", "default", "via", &API_ADDR.to_string()])?;
    run(Command::new("ip").args([
        "netns",
        "exec",
        NETNS,
        "sysctl",
        "-q",
        "-w",
        "net.ipv4.ip_forward=1",
    ]))?;
    Ok(())
}

/// What an earlier run that was killed before its teardown left: its namespace and veth (ours by name),
/// and the pods' cgroups. Its processes ended with it (the watchdogs), its mounts are under a temp dir.
fn teardown_leftovers() {
    if ip(&["netns", "pids", NETNS]).is_ok() {
        eprintln!("real node: removing namespace {NETNS} left by an earlier run");
        let _ = ip(&["netns", "del", NETNS]);
    }
    let _ = ip(&["link", "del", ROOT_VETH]);
    remove_pod_cgroups();
}

/// The pods' network namespaces (`ip netns` names CNI gives them: `cni-<uuid>`).
fn pod_netns() -> Vec<String> {
    fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cni-"))
        .collect()
}

/// Unmounts everything the kubelet and containerd mounted below `dir` (deepest first).
fn unmount_under(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let prefix = format!("{}/", dir.display());
    let mut targets: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|t| t.starts_with(&prefix))
        .collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
    for t in targets {
        // (Mount points with spaces are octal-escaped in /proc/self/mounts; ours have none.)
        if run(Command::new("umount").arg(t)).is_err() {
            let _ = run(Command::new("umount").arg("-l").arg(t));
        }
    }
}

/// Removes the kubelet's pod cgroups (`kubepods` in every v1 hierarchy), deepest first; only empty ones
/// can go, which is all of them once the containers have ended.
fn remove_pod_cgroups() {
    let Ok(hierarchies) = fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        let root = h.path().join("kubepods");
        if root.is_dir() {
            remove_dirs_deepest_first(&root);
        }
    }
}

fn remove_dirs_deepest_first(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_dirs_deepest_first(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}
