//! What the benchmark's parts share: medians, milliseconds, a throwaway network namespace.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn in_netns<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .context("unshare(CLONE_NEWNET)")?;
        let lo = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()?;
        ensure!(lo.success(), "ip link set lo up failed");
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("benchmark thread panicked"))?
}
