//! Real FRR takes every golden file in tests/golden/frr:
//!
//! ```text
//!  golden .conf ──► vtysh -C -f            syntax, no daemon            (every machine with FRR)
//!              └──► fresh zebra + bgpd in a throwaway netns (root)
//!                   frr-reload.py --reload  applied the way the agent will apply it
//!                   show running-config  == golden, byte for byte     (canonical: nothing dropped,
//!                   frr-reload.py --test  shows no "Lines To …"        reordered or respelled)
//! ```
//!
//! FRR must be installed (`apt-get install -y --no-install-recommends frr frr-pythontools`; CI's
//! `.ci/run` does): without it these tests fail rather than pass having checked nothing. The
//! namespace test needs root and is skipped (with a message) without it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str = "install FRR: apt-get install -y --no-install-recommends frr frr-pythontools \
                       (CI's .ci/run installs it)";
const FRR_LIB: &str = "/usr/lib/frr";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/frr")
}

fn goldens() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("golden dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "conf"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no golden .conf files to check");
    files
}

fn vtysh() -> &'static str {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join("vtysh").is_file()));
    assert!(found, "vtysh not found: {INSTALL}");
    "vtysh"
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `vtysh -C -f` on a file: `Ok` when FRR accepts it silently, else its message (with the line).
fn syntax_check(file: &Path) -> Result<(), String> {
    let out = run(Command::new(vtysh()).arg("-C").arg("-f").arg(file));
    let said = text(&out);
    // A zero exit code with output is still a problem: FRR reports some misplaced lines only so.
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("exit {:?}: {}", out.status.code(), said.trim()))
    }
}

#[test]
fn vtysh_accepts_every_golden() {
    let mut rejected = Vec::new();
    for file in goldens() {
        if let Err(e) = syntax_check(&file) {
            rejected.push(format!("{}: {e}", file.display()));
        }
    }
    assert!(
        rejected.is_empty(),
        "FRR rejects golden files:\n{}",
        rejected.join("\n")
    );
}

#[test]
fn vtysh_rejects_a_broken_golden_with_its_line() {
    // Without this the check above could pass by checking nothing (wrong flags, an empty file).
    let file = &goldens()[0];
    let mut broken = std::fs::read_to_string(file).expect("golden");
    let at = broken
        .find("\n  advertise-all-vni\n")
        .expect("golden has advertise-all-vni")
        + 1;
    broken.insert_str(at, "  advertise-all-vnix\n");
    let dir = scratch_dir("syntax");
    let path = dir.path.join("broken.conf");
    std::fs::write(&path, &broken).expect("write");
    let line = broken[..at].lines().count() + 1;
    let err = syntax_check(&path).expect_err("vtysh -C took a misspelt command");
    assert!(
        err.contains(&format!("line {line}:")) && err.contains("advertise-all-vnix"),
        "{err}"
    );
}

/// A directory removed on drop.
struct ScratchDir {
    path: PathBuf,
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn scratch_dir(tag: &str) -> ScratchDir {
    let path = std::env::temp_dir().join(format!("netwave-frr-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("scratch dir");
    ScratchDir { path }
}

fn is_root() -> bool {
    // The effective uid is the 2nd field of `Uid:` in /proc/self/status.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// uid and gid of the `frr` user the daemons drop to (created by the package).
fn frr_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with("frr:"))
        .unwrap_or_else(|| panic!("no user frr: {INSTALL}"));
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().expect("uid"), f[3].parse().expect("gid"))
}

/// One isolated FRR (zebra + bgpd) in its own network namespace, with every path under `dir`: nothing
/// in /etc/frr or /var/run/frr is read or written. Dropping it stops the daemons by their pids (they
/// are this process's children), then deletes the namespace and the directory.
struct Instance {
    netns: String,
    dir: ScratchDir,
    daemons: Vec<(&'static str, Child)>,
}

impl Instance {
    fn start(tag: &str) -> Instance {
        let (uid, gid) = frr_user();
        let netns = format!("nwfrr-{}-{tag}", std::process::id());
        let dir = scratch_dir(tag);
        let ok = run(Command::new("ip").args(["netns", "add", &netns]))
            .status
            .success();
        assert!(ok, "ip netns add {netns}");
        let mut me = Instance {
            netns,
            dir,
            daemons: Vec::new(),
        };
        me.ip(&["link", "set", "lo", "up"]);
        // Forwarding on, as on a node: off, FRR shows `no ip forwarding` and the text would differ.
        me.exec(&[
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv6.conf.all.forwarding=1",
        ]);
        let d = me.dir.path.clone();
        std::fs::write(d.join("vtysh.conf"), "service integrated-vtysh-config\n")
            .expect("vtysh.conf");
        for p in [d.clone(), d.join("vtysh.conf")] {
            std::os::unix::fs::chown(&p, Some(uid), Some(gid)).expect("chown to frr");
        }
        for daemon in ["zebra", "bgpd"] {
            let bin = format!("{FRR_LIB}/{daemon}");
            assert!(Path::new(&bin).is_file(), "{bin} missing: {INSTALL}");
            let d = d.display();
            // `ip netns exec` execs, so the child's pid is the daemon's.
            let child = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &me.netns,
                    &bin,
                    "-F",
                    "datacenter",
                    "-P",
                    "0",
                ])
                .args(["-f", "/dev/null", "--vty_socket", &d.to_string()])
                .args(["-i", &format!("{d}/{daemon}.pid")])
                .args(["-z", &format!("{d}/zserv.api")])
                .args(["--log", &format!("file:{d}/{daemon}.log")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("start {daemon}: {e}"));
            me.daemons.push((daemon, child));
            // bgpd needs zebra's socket; vtysh needs each daemon's vty socket.
            let ready = me.dir.path.join(if daemon == "zebra" {
                "zserv.api".to_string()
            } else {
                format!("{daemon}.vty")
            });
            me.wait_for(&ready, daemon);
        }
        me.wait_for(&d.join("zebra.vty"), "zebra");
        me
    }

    fn wait_for(&mut self, path: &Path, daemon: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !path.exists() {
            if let Some(status) = self
                .daemons
                .last_mut()
                .and_then(|(_, c)| c.try_wait().ok().flatten())
            {
                let log = std::fs::read_to_string(self.dir.path.join(format!("{daemon}.log")));
                panic!("{daemon} exited ({status}): {}", log.unwrap_or_default());
            }
            assert!(
                Instant::now() < deadline,
                "{daemon}: no {} after 10 s",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn ip(&self, args: &[&str]) {
        let out = run(Command::new("ip").arg("-n").arg(&self.netns).args(args));
        assert!(out.status.success(), "ip {args:?}: {}", text(&out));
    }

    fn exec(&self, args: &[&str]) {
        let out = run(Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .args(args));
        assert!(out.status.success(), "{args:?}: {}", text(&out));
    }

    fn vtysh(&self, command: &str) -> String {
        let d = &self.dir.path;
        let out = run(Command::new(vtysh())
            .arg("--vty_socket")
            .arg(d)
            .arg("--config_dir")
            .arg(d)
            .args(["-c", command]));
        assert!(out.status.success(), "vtysh -c {command:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `frr-reload.py --reload|--test FILE` against this instance.
    fn frr_reload(&self, mode: &str, file: &Path) -> Output {
        let d = &self.dir.path;
        run(Command::new("python3")
            .arg(format!("{FRR_LIB}/frr-reload.py"))
            .args(["--stdout", mode, "--bindir", "/usr/bin"])
            .arg("--confdir")
            .arg(d)
            .arg("--vty_socket")
            .arg(d)
            .arg("--rundir")
            .arg(d)
            .arg(file))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // bgpd first, zebra last (as frrinit.sh does); SIGTERM makes them exit in ~20 ms.
        for (daemon, child) in self.daemons.iter_mut().rev() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(3);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
            // FRR 8.4.4's bgpd can crash while shutting down (a segfault in peer_delete, seen with
            // unnumbered neighbours); it then leaves its crash log dir behind. Ours, by our pid.
            let _ = std::fs::remove_dir_all(format!("/var/tmp/frr/{daemon}.{}", child.id()));
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// The running config with FRR's header and the lines FRR adds on its own (version, the kernel's
/// host name, vtysh.conf's service line) taken out.
fn running_body(running: &str) -> String {
    let body = running
        .split_once("Current configuration:\n!\n")
        .map_or(running, |(_, b)| b);
    let mut out: String = body
        .lines()
        .filter(|l| {
            !l.starts_with("frr version ")
                && !l.starts_with("hostname ")
                && *l != "service integrated-vtysh-config"
        })
        .map(|l| format!("{l}\n"))
        .collect();
    if !out.ends_with("end\n") {
        out = format!("{}\n", out.trim_end());
    }
    out
}

#[test]
fn a_running_frr_applies_every_golden_verbatim() {
    if !is_root() {
        eprintln!(
            "SKIP a_running_frr_applies_every_golden_verbatim: needs root for network namespaces and FRR's daemons"
        );
        return;
    }
    let reload = format!("{FRR_LIB}/frr-reload.py");
    assert!(Path::new(&reload).is_file(), "{reload} missing: {INSTALL}");
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("hostname")
        .trim()
        .to_string();
    let started = Instant::now();
    let mut failures = Vec::new();
    for (i, file) in goldens().iter().enumerate() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let golden = std::fs::read_to_string(file).expect("golden");
        let fr = Instance::start(&i.to_string());
        // What the agent renders on this machine: the golden plus the kernel's host name.
        let mut with_host = golden.replacen(
            "frr defaults datacenter\n",
            &format!("frr defaults datacenter\nhostname {hostname}\n"),
            1,
        );
        assert_ne!(with_host, golden, "{name}: no `frr defaults` line");
        with_host.shrink_to_fit();
        let conf = fr.dir.path.join("new.conf");
        std::fs::write(&conf, &with_host).expect("write");

        let applied = fr.frr_reload("--reload", &conf);
        if !applied.status.success() {
            failures.push(format!(
                "{name}: frr-reload.py --reload failed: {}",
                text(&applied)
            ));
            continue;
        }
        let running = running_body(&fr.vtysh("show running-config"));
        if running != golden {
            let diff = similar::TextDiff::from_lines(&golden, &running)
                .unified_diff()
                .header(&format!("{name} (golden)"), "show running-config")
                .to_string();
            failures.push(format!("{name}: FRR shows something else:\n{diff}"));
        }
        let test = fr.frr_reload("--test", &conf);
        let said = String::from_utf8_lossy(&test.stdout);
        if !test.status.success() || said.contains("Lines To") {
            failures.push(format!(
                "{name}: frr-reload.py --test after applying it (exit {:?}):\n{said}",
                test.status.code()
            ));
        }
    }
    eprintln!(
        "{} goldens applied and compared in {:.1} s",
        goldens().len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
