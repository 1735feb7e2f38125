//! The real kube-apiserver for root tests that run in a throwaway network namespace (`common::in_netns`),
//! and the agent's real identity on it: its ServiceAccount with the RBAC `deploy/base/agent.yaml` ships.
//!
//! ```text
//!  test's network namespace                         the test binary's own namespace
//!  agent, test clients ─► 127.0.0.1:P ═ forwarder ═► 127.0.0.1:P  kube-apiserver + etcd (shared by
//!                         listener made on the        connection made on a     this binary's tests,
//!                         test's thread               `host()` thread          reset before each)
//! ```
//!
//! A socket belongs to the namespace of the thread that creates it, so the forwarder's listener is created
//! on the test's thread and its upstream connections on a runtime whose threads live in the binary's own
//! namespace. The port is the same on both sides: the control plane's kubeconfigs (`https://127.0.0.1:P`,
//! a certificate for 127.0.0.1) work unchanged inside the namespace, and TLS runs end to end. The control
//! plane itself is started from that runtime too: started from a test's thread it would live in that
//! test's namespace, out of every later test's reach.

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use tokio::runtime::{Handle, Runtime};
use tokio::task::{JoinHandle, JoinSet};

use crate::common::host_netns;

/// The namespace of the agent's ServiceAccount (as deployed).
pub const AGENT_NAMESPACE: &str = "netwave-system";

/// A runtime whose threads are in the test binary's own network namespace.
fn host() -> Result<&'static Handle> {
    static HOST: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();
    HOST.get_or_init(|| {
        let ns = host_netns().ok_or("the binary's own namespace was not recorded (in_netns)")?;
        // A fresh thread (it inherits the caller's namespace) moved back into the binary's namespace;
        // the runtime's worker thread is spawned from it and inherits that.
        std::thread::spawn(move || {
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("setns to the binary's namespace: {e}"))?;
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("host-netns")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .join()
        .map_err(|_| "the host runtime's builder panicked".to_string())?
    })
    .as_ref()
    .map(Runtime::handle)
    .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Forwards 127.0.0.1:`port` of the calling thread's namespace to 127.0.0.1:`port` of the binary's own.
/// Dropping it closes the listener and every forwarded connection.
struct Forward(JoinHandle<()>);

impl Drop for Forward {
    fn drop(&mut self) {
        // The connections are owned by the task's JoinSet: aborting the task drops them all.
        self.0.abort();
    }
}

fn forward(port: u16) -> Result<Forward> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .with_context(|| format!("binding 127.0.0.1:{port} in the test's namespace"))?;
    listener.set_nonblocking(true)?;
    let task = host()?.spawn(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return eprintln!("forwarder: {e}"),
        };
        let mut conns = JoinSet::new();
        loop {
            let mut inbound = match listener.accept().await {
                Ok((s, _)) => s,
                Err(_) => {
                    // Out of file descriptors, say: try again without spinning.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            while conns.try_join_next().is_some() {}
            conns.spawn(async move {
                // Runs on a host-runtime thread: this socket is in the binary's namespace.
                let Ok(mut upstream) =
                    tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await
                else {
                    return;
                };
                let _ = (inbound.set_nodelay(true), upstream.set_nodelay(true));
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut upstream).await;
            });
        }
    });
    Ok(Forward(task))
}

/// This test binary's shared kube-apiserver (taken exclusively and reset to empty), reachable from the
/// calling thread's network namespace, with netwave's CRDs installed and the agent's namespace created.
/// Dropping it cuts every connection from the namespace before the server goes back to the pool.
pub struct RealApi {
    // Fields drop in this order: the forwarder first, so nothing of this test reaches the next one's server.
    forward: Forward,
    cp: netwave_control_plane::Shared,
    /// An admin client (`system:masters`).
    pub admin: Client,
}

impl RealApi {
    /// Call on the test's (namespaced) thread.
    pub async fn start() -> Result<RealApi> {
        let cp = host()?
            .spawn(netwave_control_plane::shared())
            .await
            .context("taking the shared control plane")??;
        let forward = forward(cp.addr().port())?;
        let admin = cp
            .prepared(
                netwave_api::crds().into_iter().map(|(_, c)| c),
                AGENT_NAMESPACE,
            )
            .await?;
        Ok(RealApi { forward, cp, admin })
    }

    /// Installs `crds` in place of netwave's (server-side, waits until Established).
    pub async fn install_crds(
        &self,
        crds: impl IntoIterator<
            Item = k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >,
    ) -> Result<()> {
        self.cp.install_crds(&self.admin, crds).await
    }

    /// The admin kubeconfig (for binaries the test starts).
    pub fn kubeconfig(&self) -> &std::path::Path {
        self.cp.kubeconfig()
    }

    /// A token of the agent's ServiceAccount, with exactly the RBAC `deploy/base/agent.yaml` grants: the
    /// testbed authorizes everything, so this is where a rule the agent lacks shows up.
    ///
    /// The ServiceAccount, ClusterRole and ClusterRoleBinding keep their deployed names (they are what is
    /// under test) and outlive the reset; every test applies the same file server-side, so a leftover
    /// is identical to what the test would create.
    pub async fn agent_token(&self) -> Result<String> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/base/agent.yaml");
        let yaml = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&yaml).with_context(|| format!("parsing {path}"))?;
        let pp = PatchParams::apply("netwave-tests").force();
        let c = &self.admin;
        let mut applied = Vec::new();
        for doc in docs {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            // The DaemonSet and its ConfigMap need a kubelet: the test runs the agent itself.
            let name = match kind.as_str() {
                "ServiceAccount" => {
                    let o: ServiceAccount = serde_json::from_value(doc)?;
                    let ns = o.namespace().unwrap_or_default();
                    Api::<ServiceAccount>::namespaced(c.clone(), &ns)
                        .patch(&o.name_any(), &pp, &Patch::Apply(&o))
                        .await?
                        .name_any()
                }
                "ClusterRole" => {
                    let o: ClusterRole = serde_json::from_value(doc)?;
                    Api::<ClusterRole>::all(c.clone())
                        .patch(&o.name_any(), &pp, &Patch::Apply(&o))
                        .await?
                        .name_any()
                }
                "ClusterRoleBinding" => {
                    let o: ClusterRoleBinding = serde_json::from_value(doc)?;
                    Api::<ClusterRoleBinding>::all(c.clone())
                        .patch(&o.name_any(), &pp, &Patch::Apply(&o))
                        .await?
                        .name_any()
                }
                // Events about cluster-scoped objects live in `default`: a Role there grants them.
                "Role" => {
                    let o: Role = serde_json::from_value(doc)?;
                    let ns = o.namespace().unwrap_or_default();
                    Api::<Role>::namespaced(c.clone(), &ns)
                        .patch(&o.name_any(), &pp, &Patch::Apply(&o))
                        .await?
                        .name_any()
                }
                "RoleBinding" => {
                    let o: RoleBinding = serde_json::from_value(doc)?;
                    let ns = o.namespace().unwrap_or_default();
                    Api::<RoleBinding>::namespaced(c.clone(), &ns)
                        .patch(&o.name_any(), &pp, &Patch::Apply(&o))
                        .await?
                        .name_any()
                }
                _ => continue,
            };
            applied.push(format!("{kind}/{name}"));
        }
        let want = [
            "ServiceAccount/netwave-agent",
            "ClusterRole/netwave-agent",
            "ClusterRoleBinding/netwave-agent",
            "Role/netwave-agent-events",
            "RoleBinding/netwave-agent-events",
        ];
        if want.iter().any(|w| !applied.iter().any(|a| a == w)) {
            bail!("{path} should define {want:?}; found {applied:?}");
        }
        self.cp
            .service_account_token(c, AGENT_NAMESPACE, "netwave-agent", None)
            .await
    }

    /// A client with the agent's identity ([`Self::agent_token`]).
    pub async fn agent_client(&self) -> Result<Client> {
        self.cp.client_with_token(&self.agent_token().await?).await
    }

    /// Writes a kubeconfig with the agent's identity, for the agent binary.
    pub async fn write_agent_kubeconfig(&self, path: &std::path::Path) -> Result<()> {
        self.cp.write_kubeconfig(path, &self.agent_token().await?)
    }
}
