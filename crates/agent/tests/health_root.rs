//! Health probes against real sockets and links in a throwaway network namespace (root).

mod common;

use std::collections::BTreeSet;

use anyhow::ensure;
use common::{in_netns, ip};
use netwave_agent::health::{HealthConfig, PASSED, Probe, Prober};
use netwave_agent::netlink::Netlink;
use netwave_core::dataplane::NodeSettings;

#[test]
fn probes_see_what_the_namespace_has() {
    in_netns("probes_see_what_the_namespace_has", || async {
        ip(&[
            "link", "add", "veth0", "type", "veth", "peer", "name", "veth1",
        ])?;
        ip(&["addr", "add", "198.18.5.1/24", "dev", "veth0"])?;
        ip(&["link", "set", "veth0", "up"])?;
        ip(&["link", "set", "veth1", "up"])?;
        ip(&["-6", "addr", "add", "fd00:5::1/64", "dev", "veth0", "nodad"])?;
        let listener = tokio::net::TcpListener::bind("198.18.5.1:0").await?;
        let open = listener.local_addr()?;
        let nl = Netlink::connect(NodeSettings::default())?;
        let cfg = HealthConfig {
            attempt_timeout_seconds: 2.0,
            api_server: false,
            ..HealthConfig::default()
        };
        let p = Prober::new(cfg, nl, None);
        // Generous: the machine may be busy; passing probes answer in microseconds anyway.
        let lim = std::time::Duration::from_secs(2);
        let ok = |probe: Probe| {
            let p = p.clone();
            async move { p.check(&probe, lim).await }
        };
        ensure!(ok(Probe::Interface("veth*".into())).await.is_ok());
        ensure!(ok(Probe::Interface("lo".into())).await.is_ok());
        ensure!(ok(Probe::Tcp(open)).await.is_ok());
        ensure!(ok(Probe::Icmp("198.18.5.1".parse()?)).await.is_ok());
        ensure!(ok(Probe::Icmp("fd00:5::1".parse()?)).await.is_ok());

        ip(&["link", "set", "veth1", "down"])?; // veth0 loses carrier
        let e = ok(Probe::Interface("veth*".into())).await.unwrap_err();
        ensure!(e.contains("veth0") && e.contains("veth1"), "{e}");
        ensure!(
            ok(Probe::Interface("nosuch*".into()))
                .await
                .unwrap_err()
                .contains("no interface")
        );
        let closed = std::net::SocketAddr::new(open.ip(), open.port().wrapping_add(1).max(1));
        ensure!(ok(Probe::Tcp(closed)).await.is_err());
        // No route at all, and a silent address on a connected subnet.
        ensure!(ok(Probe::Icmp("203.0.113.9".parse()?)).await.is_err());
        ensure!(ok(Probe::Tcp("203.0.113.9:179".parse()?)).await.is_err());
        // A blackhole route (what a bad routing table does to a probe target): said in routing terms,
        // not as the kernel's "Invalid argument".
        ip(&["route", "add", "blackhole", "198.18.6.0/24"])?;
        for probe in [
            Probe::Icmp("198.18.6.9".parse()?),
            Probe::Tcp("198.18.6.9:179".parse()?),
        ] {
            let e = ok(probe).await.unwrap_err();
            ensure!(
                e == "no route to 198.18.6.9: a blackhole route covers it",
                "{e}"
            );
        }
        drop(listener);
        Ok(())
    });
}

#[test]
fn retries_until_a_gating_probe_passes_within_the_deadline() {
    in_netns(
        "retries_until_a_gating_probe_passes_within_the_deadline",
        || async {
            let nl = Netlink::connect(NodeSettings::default())?;
            let cfg = HealthConfig {
                tcp: vec!["127.0.0.1:17999".parse()?],
                api_server: false,
                attempt_timeout_seconds: 0.3,
                deadline_seconds: 5.0,
                backoff_initial_seconds: 0.05,
                backoff_max_seconds: 0.2,
                ..HealthConfig::default()
            };
            let p = Prober::new(cfg, nl, None);
            let gating = BTreeSet::from(["reachability 127.0.0.1:17999".to_string()]);
            // The service comes up a little after the apply.
            let late = tokio::spawn(async {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                let l = tokio::net::TcpListener::bind("127.0.0.1:17999")
                    .await
                    .unwrap();
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                drop(l);
            });
            let start = std::time::Instant::now();
            let rs = p.run_until_healthy(&gating).await;
            ensure!(
                rs.len() == 1 && rs[0].result == PASSED && rs[0].gating,
                "{rs:?}"
            );
            ensure!(start.elapsed() < std::time::Duration::from_secs(3));
            late.abort();
            Ok(())
        },
    );
}
