//! Command line and environment configuration. Every value is checked at start: a configurator that would
//! misbehave later refuses to start and says which flag is wrong.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "netwave-configurator",
    version,
    about = "Rolls netwave network config out to the fleet",
    // A flag given twice takes the last value, as with most tools (wrappers append overrides).
    args_override_self = true
)]
pub struct Args {
    /// Kubeconfig file. Without it: in-cluster service account, then $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "NETWAVE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "netwave-system")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "NETWAVE_LEASE_NAME",
        default_value = "netwave-configurator"
    )]
    pub lease_name: String,
    /// This replica's identity in the Lease. Defaults to the pod name, else host name and process id.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long a Lease stays valid after its last renewal.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops writing. Must be below --lease-duration.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub renew_deadline: Duration,
    /// Time between Lease acquire/renew attempts. Must be below --renew-deadline.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub retry_period: Duration,

    /// Default for `spec.rollout.maxUnavailable`: nodes in flight at once, a count or a percentage.
    #[arg(long, default_value = "10%", value_parser = parse_int_or_percent)]
    pub max_unavailable: IntOrPercent,
    /// Default for `spec.rollout.maxFailures`: failed nodes that halt a rollout.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_failures: u32,
    /// Default for `spec.rollout.applyTimeoutSeconds`.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub apply_timeout: Duration,
    /// Default for `spec.rollout.pickupTimeoutSeconds`: how long after assignment an agent may take
    /// to start applying (report `Provisioning`). Unset: each revision's apply timeout.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub pickup_timeout: Option<Duration>,
    /// Default for `spec.rollout.progressDeadlineSeconds`.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub progress_deadline: Duration,
    /// Revisions kept; older ones no node references are deleted.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub revision_history_limit: u32,
    /// Underlay MTU the VXLAN devices' MTU must fit in (VXLAN adds 50 bytes over IPv4, 70 over IPv6).
    #[arg(long, default_value_t = 9100, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub underlay_mtu: u32,
    /// A new revision is cut only after the inputs have stopped changing for this long, so a directory of
    /// manifests applied object by object (or a GitOps sync) becomes one revision, not a string of partial
    /// ones that each start rolling out. A steady stream of changes waits at most 10 times this. 0 = off.
    #[arg(long, env = "NETWAVE_INPUT_SETTLE", default_value = "2s", value_parser = humantime::parse_duration)]
    pub input_settle: Duration,
    /// A revision that would take more than this percentage of what the last good revision puts on the
    /// nodes off them ((node, object) placements of VRFs, layer-2 segments and routing tables: deleted
    /// objects and selectors that no longer select a node) — and always one that takes all of it — is
    /// held paused (`DestructiveChange`) until an admin resumes it, whether it is cut new, an older
    /// revision made the target again, or the sum of small steps. 100 only catches removing everything.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub destructive_threshold: u32,
    /// How new revisions are named. `hash`: `rev-3f9a0c12de`, the name's only form before 0.2.0.
    /// `sequence`: `rev-00000007-3f9a0c12de`, so `kubectl get ncr` lists revisions in creation order
    /// (the API server lists by name). Every configurator since 0.2.0 reads both; a 0.1.0
    /// configurator takes a sequence name for a tampered revision and never renders it again, so turn
    /// it on only once you will not go back to 0.1.0. Existing revisions keep their names.
    #[arg(long, env = "NETWAVE_REVISION_NAMES", value_enum, default_value_t = RevisionNames::Hash)]
    pub revision_names: RevisionNames,
    /// Default for `spec.rollout.quarantine.afterConsecutiveFailures`; off when not given. A node that
    /// failed this many revisions in a row, each provisioned by other nodes and failed by no other, is
    /// quarantined: its failures stop counting against maxFailures, it keeps its last good config and
    /// gets no new revision until an admin removes its NodeNetworkConfig's `netwave.dev/quarantined`
    /// annotation. Off, one node whose agent reports Invalid on everything fails every revision (with
    /// maxFailures 1: a veto over every change), which is the safe default for a node that is merely
    /// broken.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub quarantine_after: Option<u32>,
    /// Largest object the configurator writes, in bytes of JSON: the folded inputs of a revision (its
    /// NetworkConfigInputs) and a node's config (its NodeNetworkConfig's spec.config). Inputs that fold
    /// into more are not cut into a revision, and a revision with a larger node config fails validation,
    /// each saying so, instead of a write the API server refuses forever. The default, 1 MiB, leaves a
    /// third of etcd's default --max-request-bytes (1.5 MiB) for metadata, the agent's status and
    /// etcd's framing; raise it only together with etcd's limit. At most 3 MiB (kube-apiserver refuses
    /// larger requests whatever etcd takes).
    #[arg(
        long,
        default_value_t = netwave_core::limits::DEFAULT_MAX_OBJECT_BYTES,
        value_parser = clap::value_parser!(u64).range(1024..=netwave_core::limits::MAX_OBJECT_BYTES_CEILING)
    )]
    pub max_object_bytes: u64,
    /// How long the reconcile loop waits after a change (counted from the first one it has not
    /// planned for) for the rest of a burst before it plans: a
    /// longer window batches more agent reports into one reconcile (less configurator CPU on a large
    /// fleet), a shorter one answers each report sooner. At most 1s. The default was measured at
    /// 5,000 nodes (#28): against 5ms it halves the reconciles and cuts the leader's CPU per rollout
    /// by a quarter to a third, for about 7ms more on the median reaction.
    #[arg(long, default_value = "15ms", value_parser = humantime::parse_duration)]
    pub coalesce_window: Duration,
    /// How soon a leader aims to answer a change (an agent's report with the next assignment): it
    /// gathers further changes for what its reconciles leave of this, and at least
    /// `--coalesce-window`. On a fleet whose reconciles are fast this batches more reports into each
    /// one (fewer reconciles, less CPU); on one where they are slow it waits the window. At most 1s.
    #[arg(long, default_value = "30ms", value_parser = humantime::parse_duration)]
    pub reaction_target: Duration,
    /// Full reconcile at least this often even without changes.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub resync_interval: Duration,
    /// A replica whose caches have not synced this long after its start, or one of whose watches has
    /// kept failing this long, cannot work: it lets go of the leader Lease and fails /healthz.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub cache_sync_timeout: Duration,
    /// A reconcile pass running longer than this means the loop hangs: the replica lets go of the
    /// leader Lease and fails /healthz.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub reconcile_timeout: Duration,
    /// Test-only fault (feature `fault-hooks`, never in a shipped build): once this replica leads, its
    /// reconcile task panics (`panic`) or returns (`return`).
    #[cfg(feature = "fault-hooks")]
    #[arg(long, hide = true, value_enum)]
    pub fault_reconcile: Option<ReconcileFault>,

    /// Address of /metrics.
    #[arg(long, env = "NETWAVE_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// Address of /healthz and /readyz.
    #[arg(long, env = "NETWAVE_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: SocketAddr,
    /// Log format.
    #[arg(long, env = "NETWAVE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
}

pub use netwave_runtime::LogFormat;

/// `--revision-names` (core's [`Naming`](netwave_core::revision::Naming)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RevisionNames {
    Hash,
    Sequence,
}

impl From<RevisionNames> for netwave_core::revision::Naming {
    fn from(r: RevisionNames) -> Self {
        match r {
            RevisionNames::Hash => netwave_core::revision::Naming::Hash,
            RevisionNames::Sequence => netwave_core::revision::Naming::Sequence,
        }
    }
}

/// How the reconcile task dies under `--fault-reconcile` (tests only).
#[cfg(feature = "fault-hooks")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReconcileFault {
    Panic,
    Return,
}

/// `maxUnavailable`-style value: an absolute count or a percentage of eligible nodes.
pub type IntOrPercent = netwave_api::CountOrPercent;

pub fn parse_int_or_percent(s: &str) -> Result<IntOrPercent, String> {
    netwave_api::CountOrPercent::parse(s).map_err(|e| e.to_string())
}

impl Args {
    /// Cross-flag checks clap cannot express.
    pub fn check(&self) -> Result<(), String> {
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "--renew-deadline ({:?}) must be below --lease-duration ({:?}): a leader must stop writing \
                 before another replica may take over",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(format!(
                "--retry-period ({:?}) must be below --renew-deadline ({:?}), or the leader loses the lease \
                 between two renewals",
                self.retry_period, self.renew_deadline
            ));
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(
                "--lease-duration must be at least 1s (the Lease stores whole seconds)".into(),
            );
        }
        for (flag, d) in [
            ("--apply-timeout", Some(self.apply_timeout)),
            ("--pickup-timeout", self.pickup_timeout),
            ("--progress-deadline", Some(self.progress_deadline)),
        ] {
            let Some(d) = d else { continue };
            if d < Duration::from_secs(1) {
                return Err(format!("{flag} must be at least 1s"));
            }
        }
        if self.input_settle > Duration::from_secs(60) {
            return Err(format!(
                "--input-settle ({:?}) must be at most 60s: every input change waits this long before it \
                 becomes a revision",
                self.input_settle
            ));
        }
        if self.coalesce_window > Duration::from_secs(1) {
            return Err(format!(
                "--coalesce-window ({:?}) must be at most 1s: every agent report waits this long \
                 before the rollout answers it",
                self.coalesce_window
            ));
        }
        if self.reaction_target > Duration::from_secs(1) {
            return Err(format!(
                "--reaction-target ({:?}) must be at most 1s: an agent report may wait nearly this long \
                 before the rollout answers it",
                self.reaction_target
            ));
        }
        if self.resync_interval < Duration::from_secs(1) {
            return Err("--resync-interval must be at least 1s".into());
        }
        for (flag, d) in [
            ("--cache-sync-timeout", self.cache_sync_timeout),
            ("--reconcile-timeout", self.reconcile_timeout),
        ] {
            if d < Duration::from_secs(1) {
                return Err(format!(
                    "{flag} ({d:?}) must be at least 1s: a replica would let go of the Lease before it \
                     could sync or finish a pass"
                ));
            }
        }
        Ok(())
    }

    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Args, String> {
        let mut argv = vec!["netwave-configurator"];
        argv.extend_from_slice(extra);
        let args = Args::try_parse_from(argv).map_err(|e| e.to_string())?;
        args.check()?;
        Ok(args)
    }

    #[test]
    fn defaults_are_valid() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.max_unavailable, IntOrPercent::Percent(10));
        assert_eq!(args.lease_duration, Duration::from_secs(15));
    }

    #[test]
    fn max_unavailable_takes_counts_and_percentages() {
        assert_eq!(
            parse(&["--max-unavailable", "3"]).unwrap().max_unavailable,
            IntOrPercent::Count(3)
        );
        assert_eq!(
            parse(&["--max-unavailable", "25%"])
                .unwrap()
                .max_unavailable,
            IntOrPercent::Percent(25)
        );
        for bad in ["0", "0%", "101%", "ten", "-1", "5.5"] {
            let err = parse(&[&format!("--max-unavailable={bad}")]).unwrap_err();
            assert!(
                err.contains("--max-unavailable")
                    && (err.contains("1% to 100%") || err.contains("at least 1")),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn lease_timings_must_nest() {
        let err = parse(&["--lease-duration", "10s", "--renew-deadline", "10s"]).unwrap_err();
        assert!(err.contains("--renew-deadline"), "{err}");
        let err = parse(&["--retry-period", "12s"]).unwrap_err();
        assert!(err.contains("--retry-period"), "{err}");
        let err = parse(&["--lease-duration", "soon"]).unwrap_err();
        assert!(err.contains("--lease-duration"), "{err}");
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (flag, bad) in [
            ("--max-failures", "0"),
            ("--log-format", "xml"),
            ("--metrics-addr", "localhost"),
            ("--underlay-mtu", "900"),
            ("--max-object-bytes", "4000000"),
            ("--coalesce-window", "2s"),
            ("--reaction-target", "2s"),
        ] {
            let err = parse(&[flag, bad]).unwrap_err();
            assert!(err.contains(flag), "{flag} {bad}: {err}");
        }
        assert_eq!(
            parse(&["--coalesce-window", "15ms"])
                .unwrap()
                .coalesce_window,
            Duration::from_millis(15)
        );
    }
}
