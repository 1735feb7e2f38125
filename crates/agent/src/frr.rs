//! The FRR shell: applies a node's rendered FRR configuration (BGP EVPN) to the FRR daemons on this
//! node, through FRR's own tools. What the text says is `netwave_core::frr::render`'s business; what to do
//! about each tool's answer is decided by the pure functions here ([`bgp_content`], [`check_verdict`],
//! [`test_verdict`], [`new_l3_vnis`]), which are unit-tested without FRR.
//!
//! ```text
//!  --frr-config FILE ─► FrrSettings (YAML) ─► Frr::new (paths checked, Underlay validated; errors name the field)
//!
//!  NodeConfig ─► render ─► text ─► vtysh -C -f <scratch>       FrrRejected: nothing touched yet
//!                                  l3_vni_hold: new L3 VNIs (`show vrf vni`) → the netlink step
//!                                     creates (or sets) their VRF bridge down
//!                                  (after the netlink apply)
//!                                  write frr.conf (temp, fsync, rename, fsync dir)
//!                                  unchanged and `--test` clean: done, no reload
//!                                  frr-reload.py --reload  ─┐  FrrReloadFailed: the caller restores the
//!                                  [held bridges: wait until   last good config (kernel + FRR)
//!                                   zebra binds the VNI, up]
//!                                  frr-reload.py --test    ─┘  must show no "Lines To Add/Delete"
//! ```
//!
//! FRR's reload is not transactional (a semantic error applies the lines after it, exit code 1), so the
//! only safe answer to any failure after the check is to restore a known config. The text for that is a
//! pure function of the last good NodeConfig and the underlay, so it is re-rendered, never stored.
//!
//! **What needs FRR** ([`bgp_content`]): a VRF's `vni`, `routeTarget`, `import`, `export`, `aggregate` and
//! `communities`, and every BGPPeering: they mean nothing without BGP, so a node with FRR off refuses them (`FrrUnavailable`)
//! instead of applying the kernel half. A layer-2 segment does not: its bridge and VXLAN device are
//! kernel objects that work with statically installed flood entries (as the rootless e2e fleet and the
//! demo do), and with FRR on, `advertise-all-vni` makes every one an EVPN VNI without a line of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use netwave_api::NodeConfig;
use netwave_core::frr::{FrrError, Underlay, UnderlayError, UnderlaySettings};
use serde::Deserialize;
use tokio::process::Command;

/// This network namespace's forwarding sysctls (readable in any container; a missing file, e.g. IPv6
/// disabled, counts as on: FRR then shows no line either).
pub fn kernel_forwarding() -> netwave_core::frr::Forwarding {
    let on = |path: &str| {
        fs::read_to_string(path)
            .map(|v| v.trim() != "0")
            .unwrap_or(true)
    };
    netwave_core::frr::Forwarding {
        ipv4: on("/proc/sys/net/ipv4/ip_forward"),
        ipv6: on("/proc/sys/net/ipv6/conf/all/forwarding"),
    }
}

/// Debian's paths (package `frr` and `frr-pythontools`).
pub const DEFAULT_VTYSH: &str = "/usr/bin/vtysh";
pub const DEFAULT_FRR_RELOAD: &str = "/usr/lib/frr/frr-reload.py";
pub const DEFAULT_CONFIG_DIR: &str = "/etc/frr";
/// How long an apply waits for zebra to show a new L3 VNI before bringing its VRF bridge up.
pub const DEFAULT_L3VNI_TIMEOUT_SECONDS: f64 = 10.0;
/// How long one FRR tool may run before the step fails (a hung daemon must not hang the agent).
pub const DEFAULT_COMMAND_TIMEOUT_SECONDS: f64 = 60.0;
/// How often `show vrf vni` is polled while waiting (das-schiff polls every 500 ms too).
const L3VNI_POLL: Duration = Duration::from_millis(500);
/// How often to ask zebra whether it has learnt the config's VRFs before a reload.
const VRF_POLL: Duration = Duration::from_millis(100);
/// Lines of a reload diff or of a tool's output quoted in a status message.
const QUOTED_LINES: usize = 8;

/// The file `--frr-config` names. Without it FRR is off on this node.
///
/// ```yaml
/// underlay:                      # netwave_core::frr::UnderlaySettings
///   asn: 65000
///   vtepAddress: 198.18.1.1
///   neighbors: [{address: 198.18.0.254, remoteAs: internal}]
/// vtysh: /usr/bin/vtysh          # optional, these are the defaults
/// frrReload: /usr/lib/frr/frr-reload.py
/// configDir: /etc/frr            # frr.conf is written here; vtysh.conf is read from here
/// vtySocket: /var/run/frr        # optional: the daemons' vty socket dir (FRR's default when omitted)
/// pathspace: node1               # optional: FRR's -N (vtysh -N, frr-reload.py --pathspace)
/// runDir: /var/run/frr           # optional: frr-reload.py's temp files
/// l3VniTimeoutSeconds: 10        # optional
/// commandTimeoutSeconds: 60      # optional: one vtysh / frr-reload.py run
/// ```
///
/// With a `pathspace`, FRR's daemons read `/etc/frr/NAME/frr.conf` at start: set `configDir` to that
/// directory (not exercised by the tests, which give every path explicitly).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FrrSettings {
    pub underlay: UnderlaySettings,
    #[serde(default = "default_vtysh")]
    pub vtysh: PathBuf,
    #[serde(default = "default_frr_reload")]
    pub frr_reload: PathBuf,
    #[serde(default = "default_config_dir")]
    pub config_dir: PathBuf,
    #[serde(default)]
    pub vty_socket: Option<PathBuf>,
    #[serde(default)]
    pub pathspace: Option<String>,
    #[serde(default)]
    pub run_dir: Option<PathBuf>,
    #[serde(default = "default_l3vni_timeout")]
    pub l3_vni_timeout_seconds: f64,
    #[serde(default = "default_command_timeout")]
    pub command_timeout_seconds: f64,
}

fn default_vtysh() -> PathBuf {
    DEFAULT_VTYSH.into()
}
fn default_frr_reload() -> PathBuf {
    DEFAULT_FRR_RELOAD.into()
}
fn default_config_dir() -> PathBuf {
    DEFAULT_CONFIG_DIR.into()
}
fn default_l3vni_timeout() -> f64 {
    DEFAULT_L3VNI_TIMEOUT_SECONDS
}
fn default_command_timeout() -> f64 {
    DEFAULT_COMMAND_TIMEOUT_SECONDS
}

impl FrrSettings {
    /// Settings with Debian's paths for `underlay`.
    pub fn new(underlay: UnderlaySettings) -> FrrSettings {
        FrrSettings {
            underlay,
            vtysh: default_vtysh(),
            frr_reload: default_frr_reload(),
            config_dir: default_config_dir(),
            vty_socket: None,
            pathspace: None,
            run_dir: None,
            l3_vni_timeout_seconds: DEFAULT_L3VNI_TIMEOUT_SECONDS,
            command_timeout_seconds: DEFAULT_COMMAND_TIMEOUT_SECONDS,
        }
    }
}

/// Settings the agent cannot run FRR with; checked at start-up, so the agent refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum FrrSettingsError {
    #[error("reading FRR settings {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("FRR settings {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// `field` is the path in the file (`underlay.neighbors[1].remoteAs`, `vtysh`).
    #[error("FRR settings: {field}: {message}")]
    Invalid { field: String, message: String },
}

impl FrrSettingsError {
    pub fn category(&self) -> &'static str {
        match self {
            FrrSettingsError::Read { .. } => "read",
            FrrSettingsError::Parse { .. } => "parse",
            FrrSettingsError::Invalid { .. } => "invalid",
        }
    }
}

impl From<UnderlayError> for FrrSettingsError {
    fn from(e: UnderlayError) -> Self {
        FrrSettingsError::Invalid {
            field: format!("underlay.{}", e.field),
            message: e.message,
        }
    }
}

/// What went wrong while checking or applying FRR config. The reconcile maps these to reasons:
/// [`FrrApplyError::Rejected`] is `FrrRejected` (nothing touched), everything else `FrrReloadFailed`.
#[derive(Debug, thiserror::Error)]
pub enum FrrApplyError {
    #[error("{program} did not finish within {after:?} (killed)")]
    Timeout { program: String, after: Duration },
    #[error("running {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `vtysh -C` refused the text; `detail` starts with FRR's `line N:` when it gives one.
    #[error("{detail}")]
    Rejected { detail: String },
    #[error("frr-reload.py --reload exited {code:?}: {output}")]
    Reload { code: Option<i32>, output: String },
    #[error("frr-reload.py --test exited {code:?}: {output}")]
    Test { code: Option<i32>, output: String },
    /// The reload returned 0 but the running config still differs from the file.
    #[error("running config did not converge: {diff}")]
    NotConverged { diff: String },
    #[error("vtysh -c {command:?} exited {code:?}: {output}")]
    Show {
        command: String,
        code: Option<i32>,
        output: String,
    },
    #[error("L3 VNI {vni} not in `show vrf vni` {waited:?} after the reload")]
    L3VniMissing { vni: u32, waited: Duration },
    #[error("configuring L3 VNIs ({commands}): {output}")]
    L3VniConfig { commands: String, output: String },
    #[error("zebra has not learnt VRF {vrf} from the kernel after {waited:?} (`show vrf`)")]
    VrfUnknown { vrf: String, waited: Duration },
    #[error("bringing VRF bridge {bridge} up: {source}")]
    Bridge {
        bridge: String,
        #[source]
        source: crate::netlink::NetlinkError,
    },
}

impl FrrApplyError {
    /// A small fixed set, for metric labels and logs.
    pub fn category(&self) -> &'static str {
        match self {
            FrrApplyError::Spawn { .. } => "spawn",
            FrrApplyError::Timeout { .. } => "timeout",
            FrrApplyError::Write { .. } => "write",
            FrrApplyError::Rejected { .. } => "rejected",
            FrrApplyError::Reload { .. } => "reload",
            FrrApplyError::Test { .. } => "test",
            FrrApplyError::NotConverged { .. } => "not_converged",
            FrrApplyError::Show { .. } => "show",
            FrrApplyError::L3VniMissing { .. } => "l3vni_missing",
            FrrApplyError::VrfUnknown { .. } => "vrf_unknown",
            FrrApplyError::L3VniConfig { .. } => "l3vni_config",
            FrrApplyError::Bridge { .. } => "bridge",
        }
    }
}

/// How long each step of one FRR apply took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FrrTimings {
    pub render: Duration,
    pub check: Duration,
    pub write: Duration,
    pub reload: Duration,
    /// The `--test` after the reload (and the L3 VNI wait, if any).
    pub converge: Duration,
}

impl FrrTimings {
    pub fn total(&self) -> Duration {
        self.render + self.check + self.write + self.reload + self.converge
    }
}

/// FRR on this node: validated settings and underlay. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Frr {
    settings: FrrSettings,
    underlay: Underlay,
}

/// What `vtysh -C -f` said: `Ok` only for exit 0 *and* no output (FRR reports some misplaced lines with
/// a message and exit 0). The error is FRR's first lines, which carry `line N:` for syntax errors. Pure.
pub fn check_verdict(code: Option<i32>, stdout: &str, stderr: &str) -> Result<(), String> {
    let said: Vec<&str> = stderr
        .lines()
        .chain(stdout.lines())
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if code == Some(0) && said.is_empty() {
        return Ok(());
    }
    let mut detail = quote(&said);
    if detail.is_empty() {
        detail = format!("vtysh -C exited {code:?} without a message");
    }
    Err(detail)
}

/// What `frr-reload.py --test` said: `Ok(None)` when the running config equals the file, `Ok(Some(diff))`
/// with the "Lines To Delete/Add" part when it does not. A non-zero exit is an error whatever it printed
/// (on a file it cannot parse it prints a bogus, destructive-looking diff). Pure.
pub fn test_verdict(code: Option<i32>, stdout: &str) -> Result<Option<String>, String> {
    if code != Some(0) {
        return Err(quote(&stdout.lines().collect::<Vec<_>>()));
    }
    let Some(at) = stdout.find("Lines To ") else {
        return Ok(None);
    };
    let lines: Vec<&str> = stdout[at..]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '='))
        .collect();
    Ok(Some(quote(&lines)))
}

/// The L3 VNIs of `config` zebra has not bound to their VXLAN device yet (`ready`, from
/// [`parse_vrf_vnis`]), with the VRF bridge that must be down until it has: the reference's order, so
/// zebra reads the router MAC while the bridge is down and never takes the L3 VNI's VXLAN device for
/// an L2 VNI (`advertise-all-vni`) in between. VRFs without a bridge have nothing to hold. Pure.
pub fn new_l3_vnis(config: &NodeConfig, ready: &BTreeSet<u32>) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = config
        .vrfs
        .iter()
        .filter_map(|v| Some((v.bridge.clone()?, v.vni?)))
        .filter(|(_, vni)| !ready.contains(vni))
        .collect();
    out.sort();
    out
}

/// One VRF of `show vrf vni json` (`{"vrfs":[{"vrf":"red","vni":1000,"vxlanIntf":"vx.red",...}]}`):
/// its name, its L3 VNI (0: none) and whether zebra has bound it to a VXLAN device. A VNI that is only
/// configured (`vrf red` / `vni 1000` without the kernel's devices) shows `"vxlanIntf":"None"`.
struct VrfVni {
    vrf: Option<String>,
    vni: u32,
    bound: bool,
}

/// Every VRF of `show vrf vni json`, parsed once for both readers below. Pure.
fn vrf_vni_rows(json: &str) -> Result<Vec<VrfVni>, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON ({e}): {}", first_line(json)))?;
    let rows = v.get("vrfs").and_then(|a| a.as_array());
    Ok(rows
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let vni = u32::try_from(e.get("vni")?.as_u64()?).ok()?;
            let device = e.get("vxlanIntf").and_then(|i| i.as_str());
            Some(VrfVni {
                vrf: e.get("vrf").and_then(|n| n.as_str()).map(str::to_string),
                vni,
                bound: device.is_some_and(|i| !i.is_empty() && i != "None"),
            })
        })
        .collect())
}

/// The L3 VNIs zebra has bound to a VXLAN device, from `show vrf vni json`. Pure.
pub fn parse_vrf_vnis(json: &str) -> Result<BTreeSet<u32>, String> {
    Ok(vrf_vni_rows(json)?
        .into_iter()
        .filter(|r| r.bound && r.vni != 0)
        .map(|r| r.vni)
        .collect())
}

/// The kernel's host name (`uname -n`): FRR's daemons and vtysh show that one whatever frr.conf says,
/// so the rendered text must carry it.
/// The VRFs zebra knows from the kernel, from `show vrf` (FRR 8.4: `vrf NAME id 7 table 1001`, or
/// `vrf NAME inactive` for one that is only configured). Pure.
pub fn parse_show_vrf(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("vrf"), Some(name), Some("id")) => Some(name.to_string()),
                _ => None,
            }
        })
        .collect()
}

/// Each VRF's configured L3 VNI from `show vrf vni json`, bound to a device or not (VRFs with none
/// left out). Pure.
pub fn parse_vrf_vni_map(json: &str) -> Result<BTreeMap<String, u32>, String> {
    Ok(vrf_vni_rows(json)?
        .into_iter()
        .filter(|r| r.vni != 0)
        .filter_map(|r| Some((r.vrf?, r.vni)))
        .collect())
}

/// The L3 VNI of each `vrf NAME` block of a rendered FRR config (` vni N` inside it). Pure.
pub fn config_l3vnis(text: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut current: Option<&str> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("vrf ") {
            current = Some(name.trim());
        } else if line.starts_with("exit-vrf") || !line.starts_with(' ') {
            current = None;
        } else if let (Some(vrf), Some(vni)) = (current, line.trim().strip_prefix("vni "))
            && let Ok(vni) = vni.trim().parse()
        {
            out.insert(vrf.to_string(), vni);
        }
    }
    out
}

/// vtysh config-mode commands that give every VRF of `want` its L3 VNI, given what zebra has: nothing
/// for a VRF already mapped to it; `no vni OLD` first when the VNI changes; and `no vni OLD` for a VRF
/// that leaves: bgpd refuses `no router bgp ASN vrf X` while X has an L3 VNI ("Please unconfigure
/// l3vni"), and frr-reload.py deletes the BGP instance before the VNI, so a removed VRF's BGP instance
/// would stay (seen in the full-kernel fleet's rollback). Pure.
pub fn l3vni_commands(want: &BTreeMap<String, u32>, have: &BTreeMap<String, u32>) -> Vec<String> {
    let mut out = Vec::new();
    for (vrf, old) in have {
        if !want.contains_key(vrf) {
            out.extend([
                format!("vrf {vrf}"),
                format!("no vni {old}"),
                "exit-vrf".to_string(),
            ]);
        }
    }
    for (vrf, &vni) in want {
        let old = have.get(vrf).copied();
        if old == Some(vni) {
            continue;
        }
        out.push(format!("vrf {vrf}"));
        if let Some(old) = old {
            out.push(format!("no vni {old}"));
        }
        out.push(format!("vni {vni}"));
        out.push("exit-vrf".to_string());
    }
    out
}

/// The VRFs a rendered FRR config declares (`vrf NAME` blocks). Pure.
pub fn config_vrfs(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("vrf "))
        .map(|name| name.trim().to_string())
        .collect()
}

pub fn kernel_hostname() -> Result<String, FrrSettingsError> {
    let path = Path::new("/proc/sys/kernel/hostname");
    let h = fs::read_to_string(path).map_err(|source| FrrSettingsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(h.trim().to_string())
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn quote(lines: &[&str]) -> String {
    let lines: Vec<&str> = lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    let mut out = lines
        .iter()
        .take(QUOTED_LINES)
        .copied()
        .collect::<Vec<_>>()
        .join(" | ");
    if lines.len() > QUOTED_LINES {
        out.push_str(&format!(" | … ({} more lines)", lines.len() - QUOTED_LINES));
    }
    out
}

fn invalid(field: &str, message: impl Into<String>) -> FrrSettingsError {
    FrrSettingsError::Invalid {
        field: field.to_string(),
        message: message.into(),
    }
}

impl Frr {
    /// Reads and checks `--frr-config`. `hostname` is the kernel's (`uname -n`): FRR shows that one
    /// whatever the file says, so the rendered text must carry it.
    /// `vxlan_local` (the agent's `--vxlan-local`) is the VTEP address when the file leaves
    /// `underlay.vtepAddress` out, and must equal it when both are given: VXLAN devices send from one, FRR
    /// advertises the other.
    pub fn load(
        path: &Path,
        hostname: &str,
        vxlan_local: Option<std::net::IpAddr>,
    ) -> Result<Frr, FrrSettingsError> {
        let text = fs::read_to_string(path).map_err(|source| FrrSettingsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut settings: FrrSettings =
            serde_saphyr::from_str(&text).map_err(|e| FrrSettingsError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        match (settings.underlay.vtep_address.as_str(), vxlan_local) {
            ("", Some(local)) => settings.underlay.vtep_address = local.to_string(),
            ("", None) => {}
            (vtep, Some(local)) if vtep.parse().ok() != Some(local) => {
                return Err(invalid(
                    "underlay.vtepAddress",
                    format!(
                        "{vtep} differs from --vxlan-local {local}: VXLAN devices would send from \
                         one address while BGP advertises the other (leave vtepAddress out to use \
                         --vxlan-local)"
                    ),
                ));
            }
            _ => {}
        }
        Frr::new(settings, hostname)
    }

    /// Checks `settings`; every error names its field.
    pub fn new(settings: FrrSettings, hostname: &str) -> Result<Frr, FrrSettingsError> {
        let underlay = Underlay::new(settings.underlay.clone())?.with_hostname(hostname);
        for (field, path) in [
            ("vtysh", &settings.vtysh),
            ("frrReload", &settings.frr_reload),
        ] {
            if !path.is_file() {
                return Err(invalid(
                    field,
                    format!(
                        "{} is not a file (install frr frr-pythontools)",
                        path.display()
                    ),
                ));
            }
        }
        if settings.vtysh.parent().is_none() {
            return Err(invalid(
                "vtysh",
                "needs a directory part (frr-reload.py's --bindir)",
            ));
        }
        let dirs = [
            ("configDir", Some(&settings.config_dir)),
            ("vtySocket", settings.vty_socket.as_ref()),
            ("runDir", settings.run_dir.as_ref()),
        ];
        for (field, dir) in dirs {
            if let Some(dir) = dir {
                if !dir.is_dir() {
                    return Err(invalid(
                        field,
                        format!("{} is not a directory", dir.display()),
                    ));
                }
                if dir.to_str().is_none() {
                    return Err(invalid(field, "not a UTF-8 path"));
                }
            }
        }
        if let Some(p) = &settings.pathspace {
            let ok = !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !ok {
                return Err(invalid(
                    "pathspace",
                    format!("{p:?} is not a pathspace name ([a-zA-Z0-9._-]+)"),
                ));
            }
        }
        for (field, t) in [
            ("l3VniTimeoutSeconds", settings.l3_vni_timeout_seconds),
            ("commandTimeoutSeconds", settings.command_timeout_seconds),
        ] {
            if !(t.is_finite() && t > 0.0 && t <= 300.0) {
                return Err(invalid(
                    field,
                    format!("{t} is not a number of seconds in (0, 300]"),
                ));
            }
        }
        Ok(Frr { settings, underlay })
    }

    pub fn underlay(&self) -> &Underlay {
        &self.underlay
    }

    pub fn settings(&self) -> &FrrSettings {
        &self.settings
    }

    /// The frr.conf the agent writes and reloads from. Spelt as frr-reload.py builds its own target
    /// (`confdir + "/frr.conf"`), so the reload does not `vtysh write` the running config over it.
    pub fn config_file(&self) -> PathBuf {
        PathBuf::from(format!("{}/frr.conf", self.config_dir_str()))
    }

    /// The frr.conf on disk (what the agent that last applied wrote), `None` when there is none.
    pub fn config_on_disk(&self) -> Option<String> {
        fs::read_to_string(self.config_file()).ok()
    }

    fn config_dir_str(&self) -> &str {
        let s = self
            .settings
            .config_dir
            .to_str()
            .unwrap_or(DEFAULT_CONFIG_DIR);
        match s.trim_end_matches('/') {
            "" => "/",
            trimmed => trimmed,
        }
    }

    /// The canonical FRR text for `config` on this node, with the kernel's forwarding as it is now
    /// (netwave never changes it: see `netwave_core::frr::Forwarding`).
    pub fn render(&self, config: &NodeConfig) -> Result<String, FrrError> {
        let mut frr = netwave_core::frr::render(config, &self.underlay)?;
        frr.forwarding = kernel_forwarding();
        Ok(frr.to_text())
    }

    /// vtysh's arguments that pick this node's FRR instance.
    fn vtysh_args(&self, cmd: &mut Command) {
        cmd.arg("--config_dir").arg(self.config_dir_str());
        if let Some(s) = &self.settings.vty_socket {
            cmd.arg("--vty_socket").arg(s);
        }
        if let Some(p) = &self.settings.pathspace {
            cmd.arg("-N").arg(p);
        }
    }

    async fn run(&self, cmd: &mut Command, program: &str) -> Result<Output, FrrApplyError> {
        let after = Duration::from_secs_f64(self.settings.command_timeout_seconds);
        // kill_on_drop: a timed-out (or cancelled) tool is killed, not left running behind the agent.
        match tokio::time::timeout(after, cmd.kill_on_drop(true).output()).await {
            Ok(out) => out.map_err(|source| FrrApplyError::Spawn {
                program: program.to_string(),
                source,
            }),
            Err(_) => Err(FrrApplyError::Timeout {
                program: program.to_string(),
                after,
            }),
        }
    }

    /// `vtysh -C -f` on `text` (syntax; needs no daemon): nothing is changed whatever it says.
    pub async fn check(&self, text: &str) -> Result<(), FrrApplyError> {
        let scratch = self.scratch_path("check");
        write_file(&scratch, text.as_bytes(), false)?;
        let mut cmd = Command::new(&self.settings.vtysh);
        self.vtysh_args(&mut cmd);
        cmd.arg("-C").arg("-f").arg(&scratch);
        let out = self.run(&mut cmd, "vtysh -C").await;
        let _ = fs::remove_file(&scratch);
        let out = out?;
        check_verdict(
            out.status.code(),
            &String::from_utf8_lossy(&out.stdout),
            &String::from_utf8_lossy(&out.stderr),
        )
        .map_err(|detail| FrrApplyError::Rejected { detail })
    }

    fn scratch_path(&self, what: &str) -> PathBuf {
        PathBuf::from(format!(
            "{}/.frr.conf.netwave-{what}.{}",
            self.config_dir_str(),
            std::process::id()
        ))
    }

    /// `frr-reload.py MODE frr.conf` against this node's FRR.
    async fn frr_reload(&self, mode: &str) -> Result<Output, FrrApplyError> {
        let mut cmd = Command::new(&self.settings.frr_reload);
        let bindir = self
            .settings
            .vtysh
            .parent()
            .unwrap_or_else(|| Path::new("/usr/bin"));
        cmd.args(["--stdout", mode])
            .arg("--bindir")
            .arg(bindir)
            .arg("--confdir")
            .arg(self.config_dir_str());
        if let Some(s) = &self.settings.vty_socket {
            cmd.arg("--vty_socket").arg(s);
        }
        if let Some(p) = &self.settings.pathspace {
            cmd.arg("--pathspace").arg(p);
        }
        if let Some(r) = &self.settings.run_dir {
            cmd.arg("--rundir").arg(r);
        }
        cmd.arg(self.config_file());
        self.run(&mut cmd, "frr-reload.py").await
    }

    /// `Ok(None)` when FRR runs exactly frr.conf; else the "Lines To Delete/Add" part.
    pub async fn diff(&self) -> Result<Option<String>, FrrApplyError> {
        let out = self.frr_reload("--test").await?;
        test_verdict(out.status.code(), &String::from_utf8_lossy(&out.stdout)).map_err(|output| {
            FrrApplyError::Test {
                code: out.status.code(),
                output,
            }
        })
    }

    /// Whether FRR runs `text`: writes it as frr.conf first (it is the config FRR should run either way).
    pub async fn drifted(&self, text: &str) -> Result<Option<String>, FrrApplyError> {
        let _ = self.write_config(text)?;
        self.diff().await
    }

    /// frr.conf atomically: temp file, fsync, rename, fsync of the directory. A crash leaves the old or
    /// the new file, never a torn one (FRR reads it when it restarts). `false`: it already held `text`.
    pub fn write_config(&self, text: &str) -> Result<bool, FrrApplyError> {
        let path = self.config_file();
        if fs::read(&path).is_ok_and(|old| old == text.as_bytes()) {
            return Ok(false);
        }
        let tmp = self.scratch_path("new");
        write_file(&tmp, text.as_bytes(), true)?;
        let err = |source| FrrApplyError::Write {
            path: path.clone(),
            source,
        };
        fs::rename(&tmp, &path).map_err(err)?;
        File::open(self.config_dir_str())
            .and_then(|d| d.sync_all())
            .map_err(err)?;
        Ok(true)
    }

    /// `show bgp summary json` of this node's FRR instance (the health probes' view of the sessions).
    pub async fn bgp_summary(&self) -> Result<String, FrrApplyError> {
        self.show("show bgp summary json", |text| Ok(text.to_string()))
            .await
    }

    /// `show bgp vrf VRF neighbors json` (`default` for the default instance): the sessions of the
    /// node's BGPPeerings, dynamic ones with their peer group.
    pub async fn bgp_neighbors(&self, vrf: &str) -> Result<String, FrrApplyError> {
        self.show(&format!("show bgp vrf {vrf} neighbors json"), |text| {
            Ok(text.to_string())
        })
        .await
    }

    /// `vtysh -c <command>`, then `parse` on its output; a failure names the command.
    async fn show<T>(
        &self,
        command: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, FrrApplyError> {
        let mut cmd = Command::new(&self.settings.vtysh);
        self.vtysh_args(&mut cmd);
        cmd.arg("-c").arg(command);
        let out = self.run(&mut cmd, "vtysh").await?;
        let show = |output: String| FrrApplyError::Show {
            command: command.to_string(),
            code: out.status.code(),
            output,
        };
        if !out.status.success() {
            return Err(show(quote(
                &String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .collect::<Vec<_>>(),
            )));
        }
        parse(&String::from_utf8_lossy(&out.stdout)).map_err(show)
    }

    /// L3 VNIs zebra has bound to their VXLAN device (`show vrf vni json`).
    pub async fn vrf_vnis(&self) -> Result<BTreeSet<u32>, FrrApplyError> {
        self.show("show vrf vni json", parse_vrf_vnis).await
    }

    /// Every VRF's configured L3 VNI as zebra has it (`show vrf vni json`), bound to a device or not.
    pub async fn vrf_vni_map(&self) -> Result<BTreeMap<String, u32>, FrrApplyError> {
        self.show("show vrf vni json", parse_vrf_vni_map).await
    }

    /// Configures the L3 VNI of every VRF in `text` that zebra does not map to it yet, and removes
    /// that of every VRF `text` no longer has ([`l3vni_commands`]), with one vtysh session before the
    /// reload. frr-reload.py (8.4) adds a new `vrf X / vni N`
    /// stanza in a way zebra applies at the global level when bgpd already runs EVPN: the VNI becomes
    /// the *default* VRF's L3 VNI and the reload's second pass fails ("VNI N is already configured as
    /// L3-VNI"); seen in the full-kernel fleet. Sent this way, zebra binds it to VRF X, and the reload
    /// finds the stanza already running.
    async fn pin_l3vnis(&self, text: &str) -> Result<(), FrrApplyError> {
        let want = config_l3vnis(text);
        let commands = l3vni_commands(&want, &self.vrf_vni_map().await?);
        if commands.is_empty() {
            return Ok(());
        }
        let mut cmd = Command::new(&self.settings.vtysh);
        self.vtysh_args(&mut cmd);
        cmd.arg("-c").arg("configure");
        for c in &commands {
            cmd.arg("-c").arg(c);
        }
        let out = self.run(&mut cmd, "vtysh").await?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // vtysh exits 0 on some refusals; zebra's refusals start with '%'.
        if !out.status.success() || said.lines().any(|l| l.trim_start().starts_with('%')) {
            return Err(FrrApplyError::L3VniConfig {
                commands: commands.join("; "),
                output: quote(&said.lines().collect::<Vec<_>>()),
            });
        }
        Ok(())
    }

    /// VRFs zebra has learnt from the kernel (`show vrf`: those with an id).
    pub async fn kernel_vrfs(&self) -> Result<BTreeSet<String>, FrrApplyError> {
        self.show("show vrf", |text| Ok(parse_show_vrf(text))).await
    }

    /// Waits until zebra has learnt every VRF that `text` configures from the kernel. zebra reads new
    /// VRF devices from netlink asynchronously; a `vrf X / vni N` reaching it before it knows VRF X binds
    /// the L3 VNI to the default VRF, and the reload's second pass then fails with "VNI N is already
    /// configured as L3-VNI" (seen under load in the full-kernel fleet; das-schiff's PR #156 records
    /// the same race).
    async fn wait_for_vrfs(&self, text: &str) -> Result<(), FrrApplyError> {
        let want = config_vrfs(text);
        if want.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        let timeout = Duration::from_secs_f64(self.settings.l3_vni_timeout_seconds);
        loop {
            let known = self.kernel_vrfs().await?;
            let Some(missing) = want.iter().find(|v| !known.contains(*v)) else {
                return Ok(());
            };
            if start.elapsed() >= timeout {
                return Err(FrrApplyError::VrfUnknown {
                    vrf: missing.clone(),
                    waited: start.elapsed(),
                });
            }
            tokio::time::sleep(VRF_POLL).await;
        }
    }

    /// The VRF bridges to hold down across this apply ([`new_l3_vnis`]); asks zebra only when `config`
    /// has L3 VNIs. The caller creates (or sets) those bridges down in the netlink step.
    pub async fn l3_vni_hold(
        &self,
        config: &NodeConfig,
    ) -> Result<Vec<(String, u32)>, FrrApplyError> {
        if !config
            .vrfs
            .iter()
            .any(|v| v.vni.is_some() && v.bridge.is_some())
        {
            return Ok(Vec::new());
        }
        Ok(new_l3_vnis(config, &self.vrf_vnis().await?))
    }

    /// Everything after the check: write frr.conf, reload, verify convergence. The bridges in `hold`
    /// (down since the netlink step, see [`Frr::l3_vni_hold`]) are brought up once zebra has bound their
    /// L3 VNI (the reference's order). `timings.render` and `.check` are left for the caller.
    pub async fn apply(
        &self,
        text: &str,
        hold: &[(String, u32)],
        netlink: &crate::netlink::Netlink,
    ) -> Result<FrrTimings, FrrApplyError> {
        self.apply_inner(text, hold, netlink, false).await
    }

    /// [`Frr::apply`] for a text FRR is known not to run (drift repair has just seen the diff):
    /// straight to the reload.
    pub async fn reapply(
        &self,
        text: &str,
        netlink: &crate::netlink::Netlink,
    ) -> Result<FrrTimings, FrrApplyError> {
        self.apply_inner(text, &[], netlink, true).await
    }

    async fn apply_inner(
        &self,
        text: &str,
        hold: &[(String, u32)],
        netlink: &crate::netlink::Netlink,
        drifted: bool,
    ) -> Result<FrrTimings, FrrApplyError> {
        let mut t = FrrTimings::default();
        let start = Instant::now();
        let changed = self.write_config(text)?;
        t.write = start.elapsed();
        // The same text as before (a layer-2 change renders no FRR line; a retry): when FRR already
        // runs it, there is nothing to reload (`--test` costs a third of `--reload` + `--test`).
        if !changed && hold.is_empty() && !drifted {
            let start = Instant::now();
            if self.diff().await?.is_none() {
                t.converge = start.elapsed();
                return Ok(t);
            }
        }

        let start = Instant::now();
        self.wait_for_vrfs(text).await?;
        self.pin_l3vnis(text).await?;
        self.reload().await?;
        t.reload = start.elapsed();

        let start = Instant::now();
        if !hold.is_empty() {
            let timeout = Duration::from_secs_f64(self.settings.l3_vni_timeout_seconds);
            for (bridge, vni) in hold {
                loop {
                    if self.vrf_vnis().await?.contains(vni) {
                        break;
                    }
                    if start.elapsed() >= timeout {
                        return Err(FrrApplyError::L3VniMissing {
                            vni: *vni,
                            waited: start.elapsed(),
                        });
                    }
                    tokio::time::sleep(L3VNI_POLL).await;
                }
                netlink
                    .set_up(bridge, true)
                    .await
                    .map_err(|source| FrrApplyError::Bridge {
                        bridge: bridge.clone(),
                        source,
                    })?;
            }
        }
        if self.diff().await?.is_some() {
            // frr-reload.py orders some dependent changes so that one pass cannot finish them: it
            // deletes a removed VRF's BGP instance before the default instance's `import vrf` of it,
            // so bgpd keeps it as an implicit instance that reappears once the import goes (seen in
            // the full-kernel fleet's rollback). A second pass converges; a third would not help.
            self.reload().await?;
            if let Some(diff) = self.diff().await? {
                return Err(FrrApplyError::NotConverged { diff });
            }
        }
        t.converge = start.elapsed();
        Ok(t)
    }

    /// `frr-reload.py --reload`; a failure quotes the lines of its output that say what failed.
    async fn reload(&self) -> Result<(), FrrApplyError> {
        let out = self.frr_reload("--reload").await?;
        if out.status.success() {
            return Ok(());
        }
        let said = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Its log lines are long; the ones that say what failed mention it.
        let mut lines: Vec<&str> = said
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("fail") || l.contains("error") || l.contains('%')
            })
            .collect();
        if lines.is_empty() {
            lines = said.lines().collect();
        }
        Err(FrrApplyError::Reload {
            code: out.status.code(),
            output: quote(&lines),
        })
    }
}

fn write_file(path: &Path, bytes: &[u8], sync: bool) -> Result<(), FrrApplyError> {
    let err = |source| FrrApplyError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    if sync {
        f.sync_all().map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwave_api::VrfConfig;

    #[test]
    fn a_check_passes_only_silently() {
        assert_eq!(check_verdict(Some(0), "", "\n"), Ok(()));
        let err = check_verdict(
            Some(2),
            "",
            "line 21: % Unknown command[39]:   advertise-all-vnix\n",
        )
        .unwrap_err();
        assert_eq!(err, "line 21: % Unknown command[39]:   advertise-all-vnix");
        // Exit 0 with a message: FRR's way of saying a line was not applied.
        let err = check_verdict(
            Some(0),
            "This command is only supported under EVPN VRF\n",
            "",
        )
        .unwrap_err();
        assert!(err.contains("EVPN VRF"), "{err}");
        assert!(
            check_verdict(None, "", "")
                .unwrap_err()
                .contains("without a message")
        );
    }

    #[test]
    fn a_test_run_is_converged_only_without_lines_to_change() {
        let converged = "2026-11-23 14:00:00,000  INFO: Called via \"Namespace(...)\"\n";
        assert_eq!(test_verdict(Some(0), converged), Ok(None));
        assert_eq!(test_verdict(Some(0), ""), Ok(None));
        let drift = "\nLines To Delete\n===============\nrouter bgp 65000\n no bgp default ipv4-unicast\n\nLines To Add\n============\nrouter bgp 65000\n coalesce-time 100\n";
        let d = test_verdict(Some(0), drift).unwrap().expect("a diff");
        assert!(d.starts_with("Lines To Delete | router bgp 65000"), "{d}");
        assert!(d.contains("coalesce-time 100"), "{d}");
        // Exit 1 (a file it cannot parse) is an error even though it printed a diff.
        assert!(test_verdict(Some(1), drift).is_err());
    }

    #[test]
    fn only_l3_vnis_zebra_lacks_hold_their_bridge_down() {
        let mut c = NodeConfig::default();
        let mut red = VrfConfig::named("red");
        red.vni = Some(1000);
        red.bridge = Some("br.red".into());
        let mut blue = VrfConfig::named("blue");
        blue.vni = Some(2000);
        blue.bridge = Some("br.blue".into());
        let mut green = VrfConfig::named("green"); // no bridge: nothing to hold
        green.vni = Some(3000);
        c.vrfs = vec![red, blue, green];
        assert_eq!(
            new_l3_vnis(&c, &BTreeSet::from([1000])),
            [("br.blue".to_string(), 2000)]
        );
        assert!(new_l3_vnis(&c, &BTreeSet::from([1000, 2000])).is_empty());
    }

    #[test]
    fn only_vrfs_zebra_learnt_from_the_kernel_count() {
        let shown = "vrf cluster id 7 table 1001\nvrf storage inactive\nvrf edge id 9 table 1003 (configured)\n";
        let known = parse_show_vrf(shown);
        assert_eq!(known, BTreeSet::from(["cluster".into(), "edge".into()]));
        let text = "frr defaults datacenter\n!\nvrf cluster\n vni 2001000\nexit-vrf\n!\nvrf storage\n vni 2002000\nexit-vrf\n!\nrouter bgp 65000 vrf cluster\nexit\n";
        assert_eq!(
            config_vrfs(text),
            BTreeSet::from(["cluster".into(), "storage".into()])
        );
    }

    #[test]
    fn l3_vnis_zebra_lacks_are_configured_before_the_reload() {
        let text = "frr defaults datacenter\n!\nvrf cluster\n vni 2001000\nexit-vrf\n!\nvrf storage\n vni 2002000\nexit-vrf\n!\nvrf plain\nexit-vrf\n!\nrouter bgp 65000 vrf cluster\n address-family l2vpn evpn\n  vni 77\nexit\n";
        let want = config_l3vnis(text);
        assert_eq!(
            want,
            BTreeMap::from([("cluster".into(), 2_001_000), ("storage".into(), 2_002_000)])
        );
        let json = r#"{"vrfs":[{"vrf":"cluster","vni":2001000,"vxlanIntf":"vx.cluster"},{"vrf":"storage","vni":1999,"vxlanIntf":"None"},{"vrf":"plain","vni":0}]}"#;
        let have = parse_vrf_vni_map(json).unwrap();
        assert_eq!(
            l3vni_commands(&want, &have),
            ["vrf storage", "no vni 1999", "vni 2002000", "exit-vrf"]
        );
        assert!(l3vni_commands(&want, &want).is_empty());
        let mut leaving = want.clone();
        leaving.insert("tenantx".into(), 2_005_000);
        assert_eq!(
            l3vni_commands(&want, &leaving),
            ["vrf tenantx", "no vni 2005000", "exit-vrf"],
            "a VRF that leaves gives up its L3 VNI before the reload deletes its BGP instance"
        );
        assert_eq!(
            l3vni_commands(&want, &BTreeMap::new()).len(),
            6,
            "two new VRFs: vrf, vni, exit-vrf each"
        );
    }

    #[test]
    fn parses_show_vrf_vni() {
        // As FRR 8.4 prints it: red only configured (no kernel devices), green bound to its VXLAN device.
        let json = r#"{"vrfs":[{"vrf":"red","vni":1000,"vxlanIntf":"None","sviIntf":"None","state":"Down","routerMac":"None"},{"vrf":"green","vni":3000,"vxlanIntf":"vx.green","sviIntf":"br.green","state":"Down","routerMac":"None"},{"vrf":"blue","vni":0}]}"#;
        assert_eq!(parse_vrf_vnis(json), Ok(BTreeSet::from([3000])));
        assert_eq!(parse_vrf_vnis("{}"), Ok(BTreeSet::new()));
        assert!(parse_vrf_vnis("% Unknown command").is_err());
    }

    fn settings() -> FrrSettings {
        serde_saphyr::from_str(
            "underlay:\n  asn: 65000\n  vtepAddress: 198.18.1.1\n  neighbors:\n    - address: 198.18.0.254\n      remoteAs: internal\nconfigDir: /tmp\n",
        )
        .unwrap()
    }

    #[test]
    fn settings_errors_name_the_field() {
        let s = settings();
        assert_eq!(s.vtysh, PathBuf::from(DEFAULT_VTYSH));
        let field = |s: FrrSettings| match Frr::new(s, "node1") {
            Err(FrrSettingsError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let mut bad = s.clone();
        bad.underlay.neighbors[0].address = Some("198.18.1.1".into());
        assert_eq!(field(bad), "underlay.neighbors[0].address");
        let mut bad = s.clone();
        bad.vtysh = "/nonexistent/vtysh".into();
        assert_eq!(field(bad), "vtysh");
        let mut bad = s.clone();
        bad.frr_reload = "/nonexistent/frr-reload.py".into();
        if Path::new(DEFAULT_VTYSH).is_file() {
            assert_eq!(field(bad), "frrReload");
        }
        let mut bad = s.clone();
        bad.config_dir = "/nonexistent".into();
        bad.vtysh = "/bin/sh".into();
        bad.frr_reload = "/bin/sh".into();
        assert_eq!(field(bad.clone()), "configDir");
        bad.config_dir = "/tmp".into();
        bad.pathspace = Some("a/b".into());
        assert_eq!(field(bad.clone()), "pathspace");
        bad.pathspace = None;
        bad.l3_vni_timeout_seconds = 0.0;
        assert_eq!(field(bad.clone()), "l3VniTimeoutSeconds");
        bad.l3_vni_timeout_seconds = 10.0;
        bad.command_timeout_seconds = f64::NAN;
        assert_eq!(field(bad.clone()), "commandTimeoutSeconds");
        bad.command_timeout_seconds = 60.0;
        let frr = Frr::new(bad, "node1").expect("good settings");
        assert_eq!(frr.config_file(), PathBuf::from("/tmp/frr.conf"));
        // Unknown keys are refused too (a typo would otherwise silently fall back to a default).
        let err = serde_saphyr::from_str::<FrrSettings>(
            "underlay: {asn: 65000, vtepAddress: 198.18.1.1}\nvtyshh: /usr/bin/vtysh\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("vtyshh"), "{err}");
    }
}
