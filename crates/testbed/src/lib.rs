//! netwave-testbed: a Kubernetes API server held in memory and spoken over real HTTP, so that
//! netwave's binaries and tests use the same kube-rs client code as in a cluster.
//!
//! ```text
//!  kube::Client / kubectl ──HTTP/1.1──▶ server (routing, negotiation, faults, counters)
//!                                         │            │
//!                                         ▼            ▼
//!                                      verbs ──▶ store (objects, resourceVersion, history)
//!                                  ssa · schema         │
//!                                                       ▼
//!                                                 watch streams
//! ```
//!
//! What it serves: core/v1 Node, Namespace, Event, ConfigMap; events.k8s.io/v1 Event;
//! coordination.k8s.io/v1 Lease; CustomResourceDefinitions and the resources they define.
//!
//! Known simplifications against kube-apiserver (see README.md): server-side apply merges only
//! associative lists (`x-kubernetes-list-type: map`, Node conditions/addresses), other lists are
//! atomic; strategic merge patches on built-ins merge those lists by key and replace others;
//! no CEL validation,
//! no conversion webhooks, no admission, no authentication (tokens only identify clients for
//! partitions); namespace deletion is immediate.

pub mod cause;
pub mod events;
pub mod faults;
pub mod resources;
pub mod schema;
pub mod selector;
pub mod server;
pub mod shared;
pub mod ssa;
pub mod status;
pub mod store;
pub mod table;
pub mod verbs;
pub mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

pub use faults::{Action, Budget, Faults, Match, Partition, RequestCounts, Rule, Traffic};
use shared::Shared;
use store::Store;

/// Errors of starting the testbed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error("binding {addr}:{port}")]
    Bind {
        addr: std::net::IpAddr,
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the kubeconfig {path}")]
    WriteKubeconfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading CRDs from {path}")]
    ReadCrds {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CRD {file}: {message}")]
    BadCrd { file: String, message: String },
}

/// How to start a testbed.
#[derive(Debug, Clone)]
pub struct TestbedOptions {
    /// Address to listen on (default 127.0.0.1; the e2e harness binds an address its network namespaces
    /// can reach).
    pub bind: std::net::IpAddr,
    /// 0 picks a free port.
    pub port: u16,
    /// Where to write the kubeconfig (default: a fresh temporary directory, removed on shutdown).
    pub kubeconfig: Option<PathBuf>,
    /// CRD objects installed at start.
    pub crds: Vec<Value>,
    /// A directory of CRD YAML files installed at start.
    pub crd_dir: Option<PathBuf>,
    /// Events kept for watches; a watch from an older resourceVersion gets 410 Gone.
    pub history_limit: usize,
    /// Interval of the bookmarks sent on watches that allow them.
    pub bookmark_interval: Duration,
    /// Garbage-collect dependents through ownerReferences when owners are deleted.
    pub garbage_collection: bool,
}

impl Default for TestbedOptions {
    fn default() -> Self {
        TestbedOptions {
            bind: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            port: 0,
            kubeconfig: None,
            crds: Vec::new(),
            crd_dir: None,
            history_limit: 20_000,
            bookmark_interval: Duration::from_secs(30),
            garbage_collection: true,
        }
    }
}

impl TestbedOptions {
    /// Installs netwave's CRDs (or any) at start.
    pub fn with_crds<T: serde::Serialize>(mut self, crds: impl IntoIterator<Item = T>) -> Self {
        self.crds.extend(
            crds.into_iter()
                .map(|c| serde_json::to_value(c).expect("CRDs serialize")),
        );
        self
    }
}

/// A client's identity, for partition faults and per-client counters.
#[derive(Debug, Clone, Default)]
pub struct ClientIdentity {
    pub user_agent: Option<String>,
    pub token: Option<String>,
}

/// A running testbed.
#[derive(Debug)]
pub struct Testbed {
    addr: SocketAddr,
    kubeconfig_path: PathBuf,
    temp_dir: Option<PathBuf>,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

/// The kubeconfig YAML for a server URL.
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {url}\ncontexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: testbed\n    namespace: default\ncurrent-context: testbed\nusers:\n- name: testbed\n  user:\n    token: testbed\n"
    )
}

fn read_crd_dir(dir: &Path) -> Result<Vec<Value>, TestbedError> {
    let rd = |source| TestbedError::ReadCrds {
        path: dir.to_path_buf(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(rd)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|source| TestbedError::ReadCrds {
            path: f.clone(),
            source,
        })?;
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).map_err(|e| TestbedError::BadCrd {
                file: f.display().to_string(),
                message: e.to_string(),
            })?;
        out.extend(
            docs.into_iter()
                .filter(|d| d["kind"] == "CustomResourceDefinition"),
        );
    }
    Ok(out)
}

impl Testbed {
    /// Binds, installs the default namespaces and the given CRDs, writes the kubeconfig, serves.
    pub async fn start(opts: TestbedOptions) -> Result<Testbed, TestbedError> {
        let listener = TcpListener::bind((opts.bind, opts.port))
            .await
            .map_err(|source| TestbedError::Bind {
                addr: opts.bind,
                port: opts.port,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| TestbedError::Bind {
            addr: opts.bind,
            port: opts.port,
            source,
        })?;
        let url = format!("http://{addr}");
        let mut crds = opts.crds.clone();
        if let Some(dir) = &opts.crd_dir {
            crds.extend(read_crd_dir(dir)?);
        }
        let shared = Arc::new(Shared::new(
            Store::new(opts.history_limit),
            opts.bookmark_interval,
            opts.garbage_collection,
            addr.to_string(),
        ));
        shared.write(|st| -> Result<(), TestbedError> {
            let ns = st
                .registry
                .get("/namespaces")
                .expect("namespaces is built in");
            let w = verbs::WriteOptions {
                manager: "kube-apiserver".into(),
                ..Default::default()
            };
            for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                let t = verbs::Target {
                    rt: ns.clone(),
                    version: "v1".into(),
                    namespace: None,
                    name: None,
                    status: false,
                };
                verbs::create(st, &t, json!({"metadata": {"name": name}}), &w).map_err(|e| {
                    TestbedError::BadCrd {
                        file: name.into(),
                        message: e.to_string(),
                    }
                })?;
            }
            let crd_t = st
                .registry
                .get("apiextensions.k8s.io/customresourcedefinitions")
                .expect("CRDs are built in");
            for c in crds {
                let name = c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let t = verbs::Target {
                    rt: crd_t.clone(),
                    version: "v1".into(),
                    namespace: None,
                    name: None,
                    status: false,
                };
                verbs::create(st, &t, c, &w).map_err(|e| TestbedError::BadCrd {
                    file: name,
                    message: e.to_string(),
                })?;
            }
            Ok(())
        })?;
        let (kubeconfig_path, temp_dir) = match &opts.kubeconfig {
            Some(p) => (p.clone(), None),
            None => {
                let dir = std::env::temp_dir().join(format!(
                    "netwave-testbed-{}-{}",
                    std::process::id(),
                    addr.port()
                ));
                (dir.join("kubeconfig"), Some(dir))
            }
        };
        if let Some(parent) = kubeconfig_path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| TestbedError::WriteKubeconfig {
                path: kubeconfig_path.clone(),
                source,
            })?;
        }
        std::fs::write(&kubeconfig_path, kubeconfig_yaml(&url)).map_err(|source| {
            TestbedError::WriteKubeconfig {
                path: kubeconfig_path.clone(),
                source,
            }
        })?;
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Testbed {
            addr,
            kubeconfig_path,
            temp_dir,
            shared,
            accept,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// A kube client for this server (namespace `default`).
    pub fn client(&self) -> kube::Client {
        self.client_as(ClientIdentity::default())
    }

    /// A kube client with its own user agent and/or bearer token (for partitions).
    pub fn client_as(&self, id: ClientIdentity) -> kube::Client {
        kube::Client::try_from(self.config_as(id))
            .expect("a plain-HTTP kube config always builds a client")
    }

    /// The kube `Config` of `client_as`, for callers that tune timeouts.
    pub fn config_as(&self, id: ClientIdentity) -> kube::Config {
        let uri: http::Uri = self.url().parse().expect("the server URL parses");
        let mut cfg = kube::Config::new(uri);
        cfg.default_namespace = "default".into();
        if let Some(ua) = id.user_agent
            && let Ok(v) = http::HeaderValue::from_str(&ua)
        {
            cfg.headers.push((http::header::USER_AGENT, v));
        }
        if let Some(tok) = id.token {
            cfg.auth_info.token = Some(tok.into());
        }
        cfg
    }

    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Requests served so far, per verb and resource.
    pub fn counters(&self) -> RequestCounts {
        self.shared.counters.snapshot()
    }

    /// What the server sent each client so far (bearer token, else user agent): answer bytes, watch
    /// events and their bytes.
    pub fn traffic(&self) -> std::collections::BTreeMap<String, Traffic> {
        self.shared.counters.traffic()
    }

    pub fn reset_counters(&self) {
        self.shared.counters.reset()
    }

    /// Current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().resource_version()
    }

    /// Forgets the event history: watches resuming from older resourceVersions get 410 Gone.
    pub fn compact(&self) {
        self.shared.write(|st| st.compact());
    }

    /// Switches garbage collection of dependents on or off.
    pub fn set_garbage_collection(&self, on: bool) {
        self.shared
            .gc
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Stops serving: closes the listener and every connection (watches end abruptly).
    pub async fn shutdown(mut self) {
        self.stop();
        let _ = (&mut self.accept).await;
    }

    fn stop(&mut self) {
        self.accept.abort();
        if let Some(d) = self.temp_dir.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Connections live in this JoinSet: aborting the accept task drops it, which aborts them all.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                // Without TCP_NODELAY, delayed ACKs add ~40 ms to every other request.
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| server::handle(shared.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}
