//! A real FRR (zebra + bgpd) in the calling thread's network namespace, for the FRR root tests and the
//! benchmark (`examples/bench.rs` includes this file). Every path is under a temp dir owned by user
//! `frr`: nothing in /etc/frr or /var/run/frr is read or written. Dropping it stops the daemons by their
//! pids (bgpd first), then removes the dir.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use netwave_agent::frr::FrrSettings;
use netwave_core::frr::{NeighborSettings, RemoteAsSetting, UnderlaySettings};

pub const FRR_LIB: &str = "/usr/lib/frr";
/// The node's VTEP (on `lo`) in every FRR test namespace.
pub const VTEP: &str = "198.18.1.1";
pub const INSTALL: &str =
    "install FRR: apt-get install -y --no-install-recommends frr frr-pythontools";

/// zebra + bgpd in the calling thread's network namespace, every path under `dir`.
pub struct FrrDaemons {
    pub dir: tempfile::TempDir,
    daemons: Vec<(&'static str, Child)>,
}

pub fn frr_user() -> Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let line = passwd
        .lines()
        .find(|l| l.starts_with("frr:"))
        .with_context(|| format!("no user frr: {INSTALL}"))?;
    let f: Vec<&str> = line.split(':').collect();
    Ok((f[2].parse()?, f[3].parse()?))
}

impl FrrDaemons {
    pub fn start() -> Result<FrrDaemons> {
        let (uid, gid) = frr_user()?;
        let dir = tempfile::Builder::new().prefix("netwave-frr-").tempdir()?;
        let d = dir.path();
        std::fs::write(d.join("vtysh.conf"), "service integrated-vtysh-config\n")?;
        for p in [d.to_path_buf(), d.join("vtysh.conf")] {
            std::os::unix::fs::chown(&p, Some(uid), Some(gid)).context("chown to frr")?;
        }
        let mut me = FrrDaemons {
            dir,
            daemons: Vec::new(),
        };
        for daemon in ["zebra", "bgpd"] {
            me.start_daemon(daemon)?;
        }
        Ok(me)
    }

    /// Starts one daemon (a child of this thread, so in its namespace) and waits until it answers.
    pub fn start_daemon(&mut self, daemon: &'static str) -> Result<()> {
        let d = self.dir.path().display().to_string();
        let bin = format!("{FRR_LIB}/{daemon}");
        ensure!(Path::new(&bin).is_file(), "{bin} missing: {INSTALL}");
        let child = Command::new(&bin)
            .args(["-F", "datacenter", "-P", "0", "-f", "/dev/null"])
            .args(["--vty_socket", &d])
            .args(["-i", &format!("{d}/{daemon}.pid")])
            .args(["-z", &format!("{d}/zserv.api")])
            .args(["--log", &format!("file:{d}/{daemon}.log")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {daemon}"))?;
        self.daemons.push((daemon, child));
        let ready = self.dir.path().join(if daemon == "zebra" {
            "zserv.api".to_string()
        } else {
            format!("{daemon}.vty")
        });
        let vty = self.dir.path().join(format!("{daemon}.vty"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(ready.exists() && vty.exists()) {
            if let Some((_, c)) = self.daemons.last_mut()
                && let Some(status) = c.try_wait()?
            {
                let log = std::fs::read_to_string(self.dir.path().join(format!("{daemon}.log")));
                bail!("{daemon} exited ({status}): {}", log.unwrap_or_default());
            }
            ensure!(Instant::now() < deadline, "{daemon} not up after 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Stops one daemon by its pid (SIGTERM, then SIGKILL) and reaps it.
    pub fn stop_daemon(&mut self, daemon: &str) {
        if let Some(i) = self.daemons.iter().position(|(d, _)| *d == daemon) {
            let (name, mut child) = self.daemons.remove(i);
            stop(name, &mut child);
            let _ = std::fs::remove_file(self.dir.path().join(format!("{name}.vty")));
        }
    }

    pub fn settings(&self) -> FrrSettings {
        let mut s = FrrSettings::new(underlay());
        s.config_dir = self.dir.path().to_path_buf();
        s.vty_socket = Some(self.dir.path().to_path_buf());
        s.run_dir = Some(self.dir.path().to_path_buf());
        s
    }

    pub fn vtysh(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("vtysh")
            .arg("--vty_socket")
            .arg(self.dir.path())
            .arg("--config_dir")
            .arg(self.dir.path())
            .args(args)
            .output()
            .context("running vtysh")?;
        ensure!(
            out.status.success(),
            "vtysh {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The running config without FRR's header and the lines it adds itself.
    pub fn running(&self) -> Result<String> {
        Ok(body(&self.vtysh(&["-c", "show running-config"])?))
    }

    /// The VNIs zebra has as EVPN VNIs.
    pub fn evpn_vnis(&self) -> Result<Vec<u32>> {
        let json: serde_json::Value =
            serde_json::from_str(&self.vtysh(&["-c", "show evpn vni json"])?)?;
        let mut vnis: Vec<u32> = json
            .as_object()
            .map(|o| o.keys().filter_map(|k| k.parse().ok()).collect())
            .unwrap_or_default();
        vnis.sort();
        Ok(vnis)
    }
}

fn stop(daemon: &str, child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(3);
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    // A daemon that crashes on its way out leaves a crash dir named after its pid: ours, so ours to remove.
    let _ = std::fs::remove_dir_all(format!("/var/tmp/frr/{daemon}.{}", child.id()));
}

impl Drop for FrrDaemons {
    fn drop(&mut self) {
        // bgpd first, zebra last.
        for (daemon, child) in self.daemons.iter_mut().rev() {
            stop(daemon, child);
        }
    }
}

/// A config's or a running config's lines that carry meaning: no header, version, host name or the
/// vtysh.conf service line.
pub fn body(text: &str) -> String {
    let text = text
        .split_once("Current configuration:\n!\n")
        .map_or(text, |(_, b)| b);
    text.lines()
        .filter(|l| {
            !l.starts_with("frr version ")
                && !l.starts_with("hostname ")
                && *l != "service integrated-vtysh-config"
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// iBGP to one (absent) route reflector: the session never comes up, which the tests do not need.
pub fn underlay() -> UnderlaySettings {
    UnderlaySettings {
        asn: 65000,
        vtep_address: VTEP.into(),
        router_id: None,
        neighbors: vec![NeighborSettings {
            address: Some("198.18.0.254".into()),
            interface: None,
            remote_as: RemoteAsSetting::Keyword("internal".into()),
        }],
        timers: None,
    }
}
