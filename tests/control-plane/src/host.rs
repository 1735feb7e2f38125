//! Small things tests and benchmarks ask of the host: `ip -batch` and a process's memory.

use std::io::Write as _;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// `ip [-n NETNS] -batch -` with `lines` on its standard input (fails with ip's message).
pub fn ip_batch(netns: Option<&str>, lines: &str) -> Result<()> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running ip -batch")?;
    child
        .stdin
        .take()
        .context("ip's stdin")?
        .write_all(lines.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "ip -batch failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A `/proc/PID/status` figure in KiB (`field` such as `VmRSS:` or `VmHWM:`).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{field} of {pid}"))
}
