//! The API client's read deadline against a server that hangs the way a half-open connection does: a
//! LIST that never answers, or answers half its body and then nothing, fails with one clear error
//! within the deadline instead of waiting for ever. A watch that stays quiet longer than the deadline
//! is not cut (the watcher guards watches itself).

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery};
use axum::routing::get;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};

const IDLE: Duration = Duration::from_millis(500);

/// What the fake API server does for `/api/v1/namespaces/{ns}/configmaps`: `hung` never answers,
/// `trickle` sends the start of a list and then nothing, `quiet` answers a watch after 3 × the
/// deadline.
async fn configmaps(Path(ns): Path<String>, RawQuery(q): RawQuery) -> Body {
    let watch = q.unwrap_or_default().contains("watch=true");
    match ns.as_str() {
        "hung" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Body::empty()
        }
        "trickle" => Body::from_stream(
            futures::stream::once(async {
                Ok::<_, std::io::Error>(r#"{"apiVersion":"v1","kind":"ConfigMapList","items":["#)
            })
            .chain(futures::stream::pending()),
        ),
        "quiet" if watch => Body::from_stream(
            futures::stream::once(async {
                tokio::time::sleep(IDLE * 3).await;
                Ok::<_, std::io::Error>(concat!(
                    r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","#,
                    r#""metadata":{"name":"late","namespace":"quiet","resourceVersion":"2"}}}"#,
                    "\n"
                ))
            })
            .chain(futures::stream::pending()),
        ),
        _ => Body::from(r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{},"items":[]}"#),
    }
}

async fn client() -> kube::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/api/v1/namespaces/{ns}/configmaps", get(configmaps));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    netwave_runtime::client_with_deadline(config, IDLE).unwrap()
}

#[tokio::test]
async fn a_request_the_api_server_never_answers_fails_within_the_deadline() {
    let client = client().await;
    for ns in ["hung", "trickle"] {
        let started = Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            Api::<ConfigMap>::namespaced(client.clone(), ns).list(&ListParams::default()),
        )
        .await
        .unwrap_or_else(|_| panic!("{ns}: the LIST still waits after 10 s"));
        let took = started.elapsed();
        let err = answer.expect_err(ns).to_string();
        assert!(
            err.contains("no answer from the API server") && err.contains("configmaps"),
            "{ns}: one line naming the request: {err}"
        );
        assert!(took < IDLE * 4, "{ns}: failed after {took:?}");
        eprintln!("{ns}: {err} (after {took:?})");
    }
    let fine = Api::<ConfigMap>::namespaced(client, "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(fine.items.is_empty());
}

#[tokio::test]
async fn a_watch_quieter_than_the_deadline_is_not_cut() {
    let client = client().await;
    let api = Api::<ConfigMap>::namespaced(client, "quiet");
    let stream = api.watch(&WatchParams::default(), "0").await.unwrap();
    futures::pin_mut!(stream);
    match stream.next().await {
        Some(Ok(WatchEvent::Added(cm))) => {
            assert_eq!(cm.metadata.name.as_deref(), Some("late"))
        }
        other => panic!("the late event, not {other:?}"),
    }
}
