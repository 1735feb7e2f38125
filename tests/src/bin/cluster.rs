//! `make cluster`: a real Kubernetes cluster on this machine with netwave installed as users install it,
//! for a person to try things on. The control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler) and one node (a kubelet on containerd, kube-proxy) in network namespace
//! `netwave-real-node` (`netwave_control_plane::node`), the images from `make images` imported, then
//! `kubectl apply -k` of deploy/base (or deploy/overlays/evpn with `--evpn`) through an overlay that only
//! keeps images from being pulled and the agent's state in the cluster's own directory.
//!
//! It prints the admin kubeconfig and waits; Ctrl-C (or SIGTERM) tears everything down and leaves the
//! host as it was. Needs root.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use netwave_control_plane::node::{Cluster, ClusterOptions};
use netwave_e2e::fleet::workspace_root;
use netwave_e2e::install::{
    TAINT, evpn_patches, images_of, kubectl, pathdiff, ready_pods, until, write_overlay_on,
};
use netwave_e2e::netns::is_root;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    if !is_root() {
        bail!("make cluster needs root (it runs a kubelet, containerd and network namespaces)");
    }
    let evpn = std::env::args().any(|a| a == "--evpn");
    let (base, agent) = if evpn {
        ("deploy/overlays/evpn", "netwave-agent-frr")
    } else {
        ("deploy/base", "netwave-agent")
    };
    let images = images_of(&["netwave-configurator", agent])?;
    let t0 = Instant::now();
    println!("cluster: starting etcd, kube-apiserver, controller-manager, scheduler, a kubelet …");
    let cluster = Cluster::start(ClusterOptions {
        taints: vec![format!("{TAINT}=:NoSchedule")],
        images,
        ..ClusterOptions::default()
    })
    .await?;
    let r = install(&cluster, base, t0).await;
    if let Err(e) = &r {
        eprintln!("cluster: {e:#}");
    } else {
        wait_for_signal().await;
    }
    println!("cluster: tearing down …");
    cluster.stop().await;
    println!("cluster: stopped; the host is as it was");
    r
}

async fn install(cluster: &Cluster, base: &str, t0: Instant) -> Result<()> {
    let state = cluster.scratch_dir("agent-state");
    let extra = if base.ends_with("evpn") {
        evpn_patches(&cluster.scratch_dir("frr"), None)
    } else {
        String::new()
    };
    let overlay = write_overlay_on(base, &state, &extra)?;
    let rel = pathdiff(&overlay, &workspace_root());
    kubectl(cluster, &["apply", "-k", &rel])?;
    let admin = cluster.admin().await?;
    until(
        cluster,
        "the configurators and the agent Ready",
        Duration::from_secs(180),
        || {
            let admin = admin.clone();
            async move {
                let c = ready_pods(&admin, "netwave-configurator").await?;
                let a = ready_pods(&admin, "netwave-agent").await?;
                Ok((c.len() == 2 && a.len() == 1).then_some(()))
            }
        },
    )
    .await?;
    let _ = std::fs::remove_dir_all(&overlay);
    let kubeconfig = cluster.cp.kubeconfig().display().to_string();
    println!(
        "cluster: ready in {:.0} s: node {} (namespace netwave-real-node), netwave from {base}\n\n  \
         export KUBECONFIG={kubeconfig}\n  kubectl get nodes,pods -A\n  kubectl apply -f deploy/samples/\n  \
         kubectl get nnc,ncr -w\n\nCtrl-C stops the cluster.",
        t0.elapsed().as_secs_f64(),
        cluster.node()
    );
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
