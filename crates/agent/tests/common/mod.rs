//! Root test harness: run a test body on a thread inside a fresh network namespace.
//!
//! The thread calls `unshare(CLONE_NEWNET)`, so the namespace belongs to that thread alone; `ip` commands
//! the body spawns inherit it, and the kernel frees it (with every link in it) when the thread exits —
//! also when the test panics. Nothing on the host is touched.

#![allow(dead_code)]

use std::future::Future;
use std::process::Command;

use anyhow::{Context, Result, bail};

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
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

/// Whether `ip link add … type <kind> …` works here (the independent oracle for capability tests).
pub fn ip_can(args: &[&str]) -> bool {
    let ok = ip(args).is_ok();
    if ok {
        let _ = ip(&["link", "del", args[2]]);
    }
    ok
}
