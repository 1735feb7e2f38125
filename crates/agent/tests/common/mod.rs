//! Root test harness: run a test body on a thread inside a fresh network namespace.
//!
//! The thread calls `unshare(CLONE_NEWNET)`, so the namespace belongs to that thread alone; `ip` commands
//! the body spawns inherit it, and the kernel frees it (with every link in it) when the thread exits —
//! also when the test panics. Nothing on the host is touched.
//!
//! `real_api` (in the tests that use it) reaches the real kube-apiserver, which runs in the test
//! binary's own namespace, through [`host_netns`].

#![allow(dead_code)]

pub mod frr;

use std::future::Future;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

static HOST_NETNS: OnceLock<std::fs::File> = OnceLock::new();

/// The network namespace the test binary started in (recorded by [`in_netns`] before it leaves it).
pub fn host_netns() -> Option<&'static std::fs::File> {
    HOST_NETNS.get()
}

/// Runs `body` inside a throwaway network namespace with `lo` up. Returns `false` (and prints why) when
/// not root, so the caller can skip.
pub fn in_netns<F, Fut>(test: &str, body: F) -> bool
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>>,
{
    if !is_root() {
        eprintln!("SKIP {test}: needs root (CAP_NET_ADMIN) to create a network namespace");
        return false;
    }
    if HOST_NETNS.get().is_none()
        && let Ok(ns) = std::fs::File::open("/proc/thread-self/ns/net")
    {
        let _ = HOST_NETNS.set(ns);
    }
    let handle = std::thread::spawn(move || -> Result<()> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .context("unshare(CLONE_NEWNET)")?;
        ip(&["link", "set", "lo", "up"])?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(body())
    });
    match handle.join() {
        Ok(r) => r.unwrap(),
        Err(p) => std::panic::resume_unwind(p),
    }
    true
}

/// `ip` in the current thread's namespace; fails with its stderr.
pub fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -batch -` in this thread's namespace.
pub fn ip_batch(lines: &str) -> Result<()> {
    netwave_control_plane::host::ip_batch(None, lines)
}

/// Whether `ip link add … type <kind> …` works here (the independent oracle for capability tests).
pub fn ip_can(args: &[&str]) -> bool {
    let ok = ip(args).is_ok();
    if ok {
        let _ = ip(&["link", "del", args[2]]);
    }
    ok
}

/// A second network namespace held by a `sleep` child we started (killed by pid on drop, which frees the
/// namespace). Used as the far end of a veth pair: probe targets must not be local addresses.
pub struct PeerNs {
    child: std::process::Child,
}

impl PeerNs {
    pub fn new() -> Result<PeerNs> {
        let child = Command::new("unshare")
            .args(["-n", "sleep", "600"])
            .spawn()
            .context("spawning unshare -n sleep")?;
        // Wait until the child is in its own namespace.
        let me = std::fs::read_link("/proc/thread-self/ns/net")?;
        for _ in 0..200 {
            if let Ok(ns) = std::fs::read_link(format!("/proc/{}/ns/net", child.id()))
                && ns != me
            {
                return Ok(PeerNs { child });
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        bail!("unshare child never entered a new namespace")
    }

    /// A peer namespace wired to this one: `veth0` here with `local` (a CIDR), `veth1` there with
    /// `remote`, both up, and the peer's `lo` up.
    pub fn wired(local: &str, remote: &str) -> Result<PeerNs> {
        let peer = PeerNs::new()?;
        let pid = peer.pid().to_string();
        ip(&[
            "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", &pid,
        ])?;
        ip(&["addr", "add", local, "dev", "veth0"])?;
        ip(&["link", "set", "veth0", "up"])?;
        let remote = remote.to_string();
        peer.run(move || {
            ip(&["link", "set", "lo", "up"])?;
            ip(&["addr", "add", &remote, "dev", "veth1"])?;
            ip(&["link", "set", "veth1", "up"])
        })?;
        Ok(peer)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs `f` on a thread inside the peer namespace (sockets it opens live there).
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let path = format!("/proc/{}/ns/net", self.child.id());
        std::thread::spawn(move || -> Result<T> {
            let ns = std::fs::File::open(&path)?;
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("peer thread panicked"))?
    }
}

impl Drop for PeerNs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(unused_imports)]
pub use netwave_control_plane::poll::until;
