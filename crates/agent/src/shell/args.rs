//! Command line and environment configuration, checked at start: an agent that would misbehave later
//! refuses to start and names the flag.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use netwave_core::dataplane::{NodeSettings, VXLAN_PORT};

use crate::frr::Frr;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "netwave-agent",
    version,
    about = "Applies this node's netwave network config"
)]
pub struct Args {
    /// This node's name: the agent watches only the NodeNetworkConfig and Node of that name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Directory for the last good config backup and the applying marker (a hostPath).
    #[arg(long, env = "NETWAVE_STATE_DIR", default_value = "/var/lib/netwave")]
    pub state_dir: PathBuf,
    /// Health config file (YAML): interface globs, TCP/ICMP targets, API probe, timeouts, taints.
    #[arg(long, env = "NETWAVE_HEALTH_CONFIG")]
    pub health_config: Option<PathBuf>,
    /// How often the kernel is compared with the running config and drift repaired.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub drift_interval: Duration,
    /// Underlay address VXLAN devices send from.
    #[arg(long, env = "NETWAVE_VXLAN_LOCAL")]
    pub vxlan_local: Option<IpAddr>,
    /// VXLAN UDP port.
    #[arg(long, default_value_t = VXLAN_PORT)]
    pub vxlan_port: u16,
    /// Trunk interface for per-segment VLAN sub-interfaces (none: VXLAN only).
    #[arg(long, env = "NETWAVE_VLAN_TRUNK")]
    pub vlan_trunk: Option<String>,
    /// Interfaces never touched whatever their alias (the management NIC). Repeatable.
    #[arg(
        long = "protect",
        env = "NETWAVE_PROTECTED_INTERFACES",
        value_delimiter = ','
    )]
    pub protected: Vec<String>,
    /// Only links whose names start with one of these are ever managed. Repeatable; none: alias only.
    #[arg(
        long = "name-prefix",
        env = "NETWAVE_NAME_PREFIXES",
        value_delimiter = ','
    )]
    pub name_prefixes: Vec<String>,
    /// Kubeconfig file. Without it: in-cluster service account, then $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "NETWAVE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// A watch of its NodeNetworkConfig or Node that keeps failing this long makes the agent not ready
    /// (`/readyz` says which and why), so an agent rollout stops at a node that cannot see its
    /// assignment. The node keeps running what it runs.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    pub api_stale_after: Duration,
    /// Address of /metrics (`IP:port`; an IPv6 address may go without brackets).
    #[arg(long, env = "NETWAVE_METRICS_ADDR", default_value = "0.0.0.0:9091", value_parser = listen_addr)]
    pub metrics_addr: SocketAddr,
    /// Address of /healthz and /readyz (`IP:port`; an IPv6 address may go without brackets).
    #[arg(long, env = "NETWAVE_HEALTH_ADDR", default_value = "0.0.0.0:8082", value_parser = listen_addr)]
    pub health_addr: SocketAddr,
    #[arg(long, env = "NETWAVE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
    /// FRR settings file (YAML: `underlay` plus FRR's paths; see `frr::FrrSettings`). Without it FRR is
    /// off: configs with BGP content are refused (`FrrUnavailable`).
    #[arg(long, env = "NETWAVE_FRR_CONFIG")]
    pub frr_config: Option<PathBuf>,
    /// Render every config with one extra route (`blackhole:PREFIX`), to play an agent release whose
    /// rendering differs (upgrade drills). Only in builds with the `rendering-drill` feature.
    #[cfg(feature = "rendering-drill")]
    #[arg(long, env = "NETWAVE_RENDERING_DRILL", value_parser = crate::drill::Drill::parse)]
    pub rendering_drill: Option<crate::drill::Drill>,
}

pub use netwave_runtime::LogFormat;

/// A listen address, `IP:port` as Rust writes it (`10.0.0.1:9091`, `[fd00::1]:9091`), or an IPv6
/// address without brackets followed by `:port` (`fd00::1:9091`: the port follows the last colon). The
/// DaemonSet writes `$(NODE_IP):9091` from the node's address, which Kubernetes gives without brackets on
/// IPv4 and IPv6 nodes alike.
fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let bad = || format!("{s:?} is not IP:port (e.g. 10.0.0.1:9091, [fd00::1]:9091)");
    let (ip, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::Ipv6Addr = ip.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(SocketAddr::new(ip.into(), port))
}

impl Args {
    /// Checks values clap cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.node_name.is_empty() {
            return Err("--node-name / NODE_NAME must not be empty".into());
        }
        if self.drift_interval < Duration::from_secs(1) {
            return Err(format!(
                "--drift-interval {:?} is too short (at least 1s)",
                self.drift_interval
            ));
        }
        if self.vxlan_port == 0 {
            return Err("--vxlan-port must not be 0".into());
        }
        // Before anything else starts: an agent with bad FRR settings would refuse every BGP config.
        if self.frr_config.is_some() {
            let hostname = crate::frr::kernel_hostname().map_err(|e| e.to_string())?;
            self.frr(&hostname)?;
        }
        Ok(())
    }

    /// FRR on this node, from `--frr-config` (`None`: off). `hostname` is the kernel's (`uname -n`).
    pub fn frr(&self, hostname: &str) -> Result<Option<Frr>, String> {
        let Some(path) = &self.frr_config else {
            return Ok(None);
        };
        Frr::load(path, hostname, self.vxlan_local)
            .map(Some)
            .map_err(|e| format!("--frr-config {}: {e}", path.display()))
    }

    pub fn node_settings(&self) -> NodeSettings {
        NodeSettings {
            vxlan_local: self.vxlan_local,
            vxlan_port: self.vxlan_port,
            vlan_trunk: self.vlan_trunk.clone(),
            name_prefixes: self.name_prefixes.clone(),
            protected: self.protected.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks() {
        let a = Args::try_parse_from([
            "netwave-agent",
            "--node-name",
            "n1",
            "--protect",
            "eth0,eth1",
            "--drift-interval",
            "30s",
        ])
        .unwrap();
        assert_eq!(a.state_dir, PathBuf::from("/var/lib/netwave"));
        assert_eq!(a.node_settings().protected, ["eth0", "eth1"]);
        assert_eq!(a.node_settings().vxlan_port, 4789);
        assert!(a.check().is_ok());
        let bad = Args::try_parse_from([
            "netwave-agent",
            "--node-name",
            "n1",
            "--drift-interval",
            "10ms",
        ])
        .unwrap();
        assert!(bad.check().unwrap_err().contains("--drift-interval"));
    }

    /// The DaemonSet's `$(NODE_IP):9091` works on IPv6 nodes too, where the address comes unbracketed.
    #[test]
    fn listen_addresses_take_the_node_ip_of_either_family() {
        for (given, want) in [
            ("10.0.0.1:9091", "10.0.0.1:9091"),
            ("[fd00::1]:9091", "[fd00::1]:9091"),
            ("fd00::1:9091", "[fd00::1]:9091"),
            ("127.0.0.1:8082", "127.0.0.1:8082"),
        ] {
            let a = Args::try_parse_from([
                "netwave-agent",
                "--node-name",
                "n1",
                "--metrics-addr",
                given,
            ])
            .unwrap();
            assert_eq!(a.metrics_addr.to_string(), want, "{given}");
        }
        for bad in ["10.0.0.1", "fd00::1", "10.0.0.1:x", ":9091", "node-a:9091"] {
            let e =
                Args::try_parse_from(["netwave-agent", "--node-name", "n1", "--health-addr", bad])
                    .unwrap_err()
                    .to_string();
            assert!(e.contains("is not IP:port"), "{bad}: {e}");
        }
    }

    #[test]
    fn frr_is_off_without_the_flag_and_bad_settings_name_the_field() {
        let a = Args::try_parse_from(["netwave-agent", "--node-name", "n1"]).unwrap();
        assert!(a.frr("n1").unwrap().is_none());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("frr.yaml");
        std::fs::write(
            &file,
            "underlay:\n  asn: 65000\n  vtepAddress: 2001:db8::1\nconfigDir: /tmp\n",
        )
        .unwrap();
        let a = Args::try_parse_from([
            "netwave-agent",
            "--node-name",
            "n1",
            "--frr-config",
            file.to_str().unwrap(),
        ])
        .unwrap();
        let err = a.frr("n1").unwrap_err();
        assert!(
            err.starts_with("--frr-config ") && err.contains("underlay.vtepAddress"),
            "{err}"
        );
        std::fs::write(
            &file,
            "underlay: {asn: 65000, vtepAddress: 198.18.1.1}\nconfDir: /tmp\n",
        )
        .unwrap();
        let err = a.frr("n1").unwrap_err();
        assert!(err.contains("confDir"), "{err}");
    }

    /// One underlay file serves a pool: each node's VTEP is its own `--vxlan-local` (the DaemonSet's
    /// node address), never an address that differs from the one its VXLAN devices send from.
    #[test]
    fn a_pool_wide_underlay_file_takes_each_nodes_vtep_from_vxlan_local() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("frr.yaml");
        let agent = |extra: &[&str]| {
            let mut argv = vec![
                "netwave-agent",
                "--node-name",
                "n1",
                "--frr-config",
                file.to_str().unwrap(),
            ];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap()
        };
        let pool = format!(
            "underlay:\n  asn: 65000\n  neighbors: [{{address: 198.18.0.254, remoteAs: internal}}]\n\
             configDir: {}\nrunDir: {}\n",
            dir.path().display(),
            dir.path().display()
        );
        std::fs::write(&file, &pool).unwrap();
        let err = agent(&[]).frr("n1").unwrap_err();
        assert!(
            err.contains("vtepAddress") && err.contains("--vxlan-local"),
            "{err}"
        );
        let frr = agent(&["--vxlan-local", "198.18.1.7"])
            .frr("n1")
            .unwrap()
            .unwrap();
        assert_eq!(frr.underlay().vtep().to_string(), "198.18.1.7");
        std::fs::write(
            &file,
            pool.replace("asn: 65000", "asn: 65000\n  vtepAddress: 198.18.1.8"),
        )
        .unwrap();
        let err = agent(&["--vxlan-local", "198.18.1.7"])
            .frr("n1")
            .unwrap_err();
        assert!(
            err.contains("198.18.1.8 differs from --vxlan-local 198.18.1.7"),
            "{err}"
        );
    }
}
