//! A real FRR (zebra + bgpd) for tests: one instance per network namespace, every path (pid files, vty
//! sockets, zserv.api, logs, frr.conf) under a temp dir owned by user `frr`, nothing in /etc/frr or
//! /var/run/frr read or written. The agent's FRR root tests and the e2e fleet use this one harness.
//!
//! ```text
//!  FrrInstance::start()        zebra, bgpd: children of the calling thread (its network namespace)
//!  FrrInstance::start_in(ns)   `ip netns exec NS zebra …` (ip execs: the child's pid is the daemon's)
//!      dir/ zebra.vty bgpd.vty zserv.api *.pid *.log vtysh.conf (frr.conf: whoever applies config)
//!  vtysh --vty_socket dir …    needs no namespace: it talks over the unix sockets
//! ```
//!
//! The daemons run in the foreground as our children, so we hold their pids: dropping an instance stops
//! them by pid (SIGTERM, SIGKILL after 3 s; bgpd first, zebra last), reaps them, then removes the dir —
//! also when a test panics. Deleting a namespace does not end the processes in it: a harness drops its
//! instances before it deletes their namespaces. (Foreground, not `-d`: a daemonised FRR is re-parented to
//! PID 1, which on these VMs reaps only every ~2 s, so its stop could not be observed; see FRR-LAB.md §2.)

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// Where Debian's `frr` package puts the daemons.
pub const FRR_LIB: &str = "/usr/lib/frr";
/// What to run when FRR is missing.
pub const INSTALL: &str =
    "install FRR: apt-get install -y --no-install-recommends frr frr-pythontools";

/// Whether FRR's daemons, vtysh and frr-reload.py are installed.
pub fn installed() -> bool {
    ["zebra", "bgpd", "frr-reload.py"]
        .iter()
        .all(|d| Path::new(&format!("{FRR_LIB}/{d}")).is_file())
        && Path::new("/usr/bin/vtysh").is_file()
}

/// User `frr`'s uid and gid: the daemons drop to it, so their dir must be its.
pub fn frr_user() -> Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let line = passwd
        .lines()
        .find(|l| l.starts_with("frr:"))
        .with_context(|| format!("no user frr: {INSTALL}"))?;
    let f: Vec<&str> = line.split(':').collect();
    Ok((f[2].parse()?, f[3].parse()?))
}

/// zebra + bgpd of one namespace, every path under [`FrrInstance::dir`].
pub struct FrrInstance {
    dir: tempfile::TempDir,
    /// `None`: the namespace of the thread that started it.
    netns: Option<String>,
    daemons: Vec<(&'static str, Child)>,
}

impl FrrInstance {
    /// zebra + bgpd in the calling thread's network namespace.
    pub fn start() -> Result<FrrInstance> {
        Self::start_netns(None)
    }

    /// zebra + bgpd in the named network namespace (`ip netns add` made it).
    pub fn start_in(netns: &str) -> Result<FrrInstance> {
        Self::start_netns(Some(netns.to_string()))
    }

    fn start_netns(netns: Option<String>) -> Result<FrrInstance> {
        let (uid, gid) = frr_user()?;
        let dir = tempfile::Builder::new().prefix("netwave-frr-").tempdir()?;
        let d = dir.path();
        std::fs::write(d.join("vtysh.conf"), "service integrated-vtysh-config\n")?;
        for p in [d.to_path_buf(), d.join("vtysh.conf")] {
            std::os::unix::fs::chown(&p, Some(uid), Some(gid)).context("chown to frr")?;
        }
        let mut me = FrrInstance {
            dir,
            netns,
            daemons: Vec::new(),
        };
        for daemon in ["zebra", "bgpd"] {
            me.start_daemon(daemon)?;
        }
        Ok(me)
    }

    /// The instance's dir: `--vty_socket`, `--config_dir` and frr-reload.py's `--rundir`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The daemons' pids (bgpd, zebra, … in start order).
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.daemons.iter().map(|(d, c)| (*d, c.id())).collect()
    }

    /// Starts one daemon and waits until it answers (zebra: zserv.api and its vty; others: their vty).
    pub fn start_daemon(&mut self, daemon: &'static str) -> Result<()> {
        let d = self.dir.path().display().to_string();
        let bin = format!("{FRR_LIB}/{daemon}");
        ensure!(Path::new(&bin).is_file(), "{bin} missing: {INSTALL}");
        let mut cmd = match &self.netns {
            None => Command::new(&bin),
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, &bin]);
                c
            }
        };
        let child = cmd
            .args(["-F", "datacenter", "-P", "0", "-f", "/dev/null"])
            .args(["--vty_socket", &d])
            .args(["-i", &format!("{d}/{daemon}.pid")])
            .args(["-z", &format!("{d}/zserv.api")])
            .args(["--log", &format!("file:{d}/{daemon}.log")])
            .stdin(Stdio::null())
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

    /// Stops every daemon (bgpd first, zebra last). Dropping the instance does this too.
    pub fn stop(&mut self) {
        while let Some((daemon, mut child)) = self.daemons.pop() {
            stop(daemon, &mut child);
        }
    }

    /// `vtysh` on this instance's sockets; fails with its output when it exits non-zero.
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

    /// The VNIs zebra has as EVPN VNIs (`show evpn vni`), sorted.
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

impl Drop for FrrInstance {
    fn drop(&mut self) {
        self.stop();
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
