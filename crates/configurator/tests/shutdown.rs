//! A configurator that cannot reach its API server still stops when asked (SIGTERM in a pod): the
//! kubelet would otherwise kill it after the grace period, and it must not spin meanwhile.

mod common;

use std::time::{Duration, Instant};

use common::args;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_without_an_api_server_ends_promptly() {
    // Nothing listens on port 1 of loopback: every request is refused.
    let mut config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
    config.accept_invalid_certs = true;
    let client = kube::Client::try_from(config).unwrap();
    let asked = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let at = asked.clone();
    let run = netwave_configurator::runtime::run_with(args(&[]), client, async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        *at.lock().unwrap() = Some(Instant::now());
    });
    let cpu_before = cpu_seconds();
    let result = tokio::time::timeout(Duration::from_secs(20), run).await;
    let stopped_after = asked.lock().unwrap().map(|t| t.elapsed());
    assert!(
        result.is_ok(),
        "still running 18 s after shutdown was asked for"
    );
    let took = stopped_after.unwrap();
    assert!(
        took < Duration::from_secs(5),
        "stopped {took:?} after being asked"
    );
    // Waiting on a dead API server is not work: well under a core-second over these ~2 s (the loop
    // that spun on a closed channel burnt a whole core).
    let cpu = cpu_seconds() - cpu_before;
    eprintln!("shutdown took {took:?}; process CPU meanwhile {cpu:.2} s");
    assert!(cpu < 1.5, "{cpu:.2} CPU seconds while waiting for nothing");
}

/// User + system CPU seconds of this process so far (Linux /proc).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}
