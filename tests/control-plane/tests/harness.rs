//! The harness itself: a control plane starts, serves as admin, and is gone with its owner.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use netwave_control_plane::poll::until;
use netwave_control_plane::{ControlPlane, Options, shared};

#[tokio::test]
async fn the_shared_control_plane_serves_the_admin_and_starts_empty() {
    let cp = shared().await.unwrap();
    let client = cp.client().await.unwrap();
    let v = client.apiserver_version().await.unwrap();
    assert_eq!(
        v.git_version, "v1.37.2",
        "the server built from k8s.io/kubernetes"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    cp.reset(&client).await.unwrap();
    assert!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// A dropped control plane leaves no process behind and frees its port.
#[tokio::test]
async fn dropping_a_control_plane_stops_both_servers() {
    let cp = ControlPlane::start(Options::default()).await.unwrap();
    let addr = cp.addr();
    let pids = server_pids(cp.kubeconfig().parent().unwrap());
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver run: {pids:?}");
    drop(cp);
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "server {pid} still runs after drop"
        );
    }
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// A test binary that dies without running any destructor (SIGKILL) still takes its servers with it.
#[tokio::test]
async fn a_killed_owner_takes_its_servers_with_it() {
    let exe = std::env::current_exe().unwrap();
    let output = std::env::temp_dir().join(format!("owner-{}.log", std::process::id()));
    let log = std::fs::File::create(&output).unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "owner_that_gets_killed",
            "--ignored",
            "--nocapture",
        ])
        .env(
            "NETWAVE_OWNER_DIR_FILE",
            std::env::temp_dir().join(format!("owner-{}", std::process::id())),
        )
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let marker = std::env::temp_dir().join(format!("owner-{}", std::process::id()));
    // Longer than the owner's own limits (etcd 30 s, kube-apiserver 90 s), so that it reports first.
    let said = || std::fs::read_to_string(&output).unwrap_or_default();
    let started = until(
        "the owner to start its control plane",
        Duration::from_secs(180),
        async || {
            // The owner renames a finished file into place, so a marker that exists is whole; an
            // empty path would match every server on the machine.
            if let Ok(d) = std::fs::read_to_string(&marker)
                && !d.is_empty()
            {
                return Ok(Ok(std::path::PathBuf::from(d)));
            }
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("the owner exited ({status}) before starting its control plane");
            }
            Ok(Err("no marker yet".to_string()))
        },
    )
    .await;
    let dir = started.unwrap_or_else(|e| panic!("{e:#}:\n{}", said()));
    let pids = server_pids(&dir);
    assert_eq!(pids.len(), 2, "{pids:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&output);
    until(
        "the servers to end with their killed owner",
        Duration::from_secs(20),
        async || {
            let alive: Vec<_> = pids
                .iter()
                .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
                .collect();
            Ok(alive
                .is_empty()
                .then_some(())
                .ok_or(format!("alive: {alive:?}")))
        },
    )
    .await
    .unwrap();
}

/// Run by `a_killed_owner_takes_its_servers_with_it` as a separate process.
#[tokio::test]
#[ignore = "helper process of a_killed_owner_takes_its_servers_with_it"]
async fn owner_that_gets_killed() {
    let cp = ControlPlane::start(Options::default()).await.unwrap();
    let file = std::env::var("NETWAVE_OWNER_DIR_FILE").unwrap();
    // Written aside and renamed into place: the test reads it the moment it exists.
    let partial = format!("{file}.partial");
    std::fs::write(
        &partial,
        cp.kubeconfig().parent().unwrap().to_str().unwrap(),
    )
    .unwrap();
    std::fs::rename(&partial, &file).unwrap();
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// Pids of processes whose command line mentions `dir` and that are etcd or kube-apiserver themselves.
fn server_pids(dir: &std::path::Path) -> Vec<u32> {
    let dir = dir.to_str().unwrap();
    assert!(
        dir.len() > 1,
        "a control plane's directory, not {dir:?}: it would match every server"
    );
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let exe = args.first().cloned().unwrap_or_default();
        if (exe.ends_with("/etcd") || exe.ends_with("/kube-apiserver"))
            && args.iter().any(|a| a.contains(dir))
        {
            pids.push(pid);
        }
    }
    pids
}
