//! Watch streams: initial events, history replay from a resourceVersion, selector transitions,
//! bookmarks (periodic and `k8s.io/initial-events-end`), timeouts, 410 for compacted history,
//! and abrupt cuts from fault injection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::selector::Selectors;
use crate::shared::Shared;
use crate::store::{Event, EventType, Object};
use crate::table::metadata_view;
use crate::verbs::{Target, present};

/// Query parameters of a watch.
#[derive(Debug, Clone, Default)]
pub struct WatchParams {
    pub resource_version: Option<String>,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    pub send_initial_events: Option<bool>,
    pub selectors: Selectors,
    /// Send `PartialObjectMetadata` instead of full objects.
    pub metadata_only: bool,
    /// Send one-row `Table`s (kubectl get -w), with this `includeObject`.
    pub table: Option<String>,
    pub user_agent: String,
    pub token: String,
}

/// One line of the stream, or an abort.
pub type Chunk = Result<Bytes, std::io::Error>;

fn line(kind: &str, obj: &Value) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    serde_json::to_writer(&mut out, obj).expect("a JSON value serializes");
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn raw_line(kind: &str, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(json);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

struct Watcher {
    shared: Arc<Shared>,
    t: Target,
    p: WatchParams,
    tx: mpsc::Sender<Chunk>,
    key: String,
    sent_table: std::sync::atomic::AtomicBool,
}

impl Watcher {
    fn matches(&self, obj: &Object) -> bool {
        let in_scope = match &self.t.namespace {
            Some(ns) => obj.namespace.as_deref() == Some(ns.as_str()),
            None => true,
        };
        in_scope && self.p.selectors.matches_object(obj)
    }

    async fn send_obj(&self, kind: EventType, obj: &Arc<Object>) -> bool {
        let obj = present(obj, &self.t);
        let body = if let Some(include) = &self.p.table {
            let rv = obj.value()["metadata"]["resourceVersion"].clone();
            let mut t = crate::table::table(
                &self.t.rt,
                &self.t.version,
                std::slice::from_ref(&obj),
                include,
                json!({"resourceVersion": rv}),
            );
            // Column definitions travel with the first event only, as kube-apiserver sends them.
            if self
                .sent_table
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                t["columnDefinitions"] = json!([]);
            }
            line(kind.as_str(), &t)
        } else if self.p.metadata_only {
            line(kind.as_str(), &metadata_view(&obj.value()))
        } else {
            raw_line(kind.as_str(), &obj.json)
        };
        let len = body.len();
        let sent = self.tx.send(Ok(body)).await.is_ok();
        if sent {
            let who = if self.p.token.is_empty() {
                &self.p.user_agent
            } else {
                &self.p.token
            };
            self.shared
                .counters
                .record_watch_event(who, &self.t.rt.plural, len);
        }
        sent
    }

    /// The event this watcher sees for a change, if any (selector transitions included).
    fn translate(&self, ev: &Event) -> Option<(EventType, Arc<Object>)> {
        if *ev.resource != *self.key {
            return None;
        }
        match ev.kind {
            EventType::Added => self
                .matches(&ev.object)
                .then(|| (EventType::Added, ev.object.clone())),
            EventType::Deleted => {
                let was = ev.prev.as_deref().unwrap_or(&ev.object);
                self.matches(was)
                    .then(|| (EventType::Deleted, ev.object.clone()))
            }
            EventType::Modified => {
                let now = self.matches(&ev.object);
                let was = ev.prev.as_deref().is_some_and(|p| self.matches(p));
                match (was, now) {
                    (true, true) => Some((EventType::Modified, ev.object.clone())),
                    (false, true) => Some((EventType::Added, ev.object.clone())),
                    (true, false) => {
                        // The last state that matched, at the resourceVersion of the change.
                        let mut last = ev.prev.as_deref().map(Object::value).unwrap_or_default();
                        last["metadata"]["resourceVersion"] = json!(ev.rv.to_string());
                        Some((EventType::Deleted, Arc::new(Object::from_value(&last))))
                    }
                    (false, false) => None,
                }
            }
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            "BOOKMARK",
            &json!({"kind": self.t.rt.kind, "apiVersion": self.t.rt.api_version(&self.t.version), "metadata": meta}),
        )
    }

    async fn run(self) {
        let mut notify = self.shared.notify.subscribe();
        let mut cuts = self.shared.faults.subscribe_cuts();
        let epoch = self.shared.faults.cut_epoch();
        let rv_param = self.p.resource_version.clone().unwrap_or_default();
        let initial = match self.p.send_initial_events {
            Some(v) => v,
            None => rv_param.is_empty() || rv_param == "0",
        };
        // Initial state (a consistent snapshot) or the starting point in history.
        let start: Result<(u64, Vec<Arc<Object>>), String> = {
            let st = self.shared.lock();
            if initial {
                let items: Vec<Arc<Object>> = st
                    .range(&self.t.rt, self.t.namespace.as_deref(), None)
                    .filter(|(_, o)| self.p.selectors.matches_object(o))
                    .map(|(_, o)| o.clone())
                    .collect();
                Ok((st.resource_version(), items))
            } else if rv_param.is_empty() || rv_param == "0" {
                // sendInitialEvents=false without a version: start at the most recent.
                Ok((st.resource_version(), Vec::new()))
            } else {
                rv_param
                    .parse::<u64>()
                    .map(|rv| (rv, Vec::new()))
                    .map_err(|_| rv_param.clone())
            }
        };
        let (mut cursor, snapshot) = match start {
            Ok(s) => s,
            Err(bad) => {
                let status = crate::status::ApiError::bad_request(format!(
                    "invalid resource version: {bad}"
                ));
                let _ = self.tx.send(Ok(line("ERROR", &status.to_status()))).await;
                return;
            }
        };
        for o in &snapshot {
            if !self.send_obj(EventType::Added, o).await {
                return;
            }
        }
        drop(snapshot);
        if self.p.send_initial_events == Some(true)
            && self.p.bookmarks
            && self.tx.send(Ok(self.bookmark(cursor, true))).await.is_err()
        {
            return;
        }
        let deadline = self.p.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut ticker = tokio::time::interval(self.shared.bookmark_interval);
        ticker.tick().await;
        loop {
            let batch = {
                let st = self.shared.lock();
                let r = st.events_after(cursor, 512);
                if matches!(&r, Ok(evs) if evs.is_empty()) {
                    cursor = cursor.max(st.resource_version());
                }
                r
            };
            let batch = match batch {
                Ok(b) => b,
                Err(compacted) => {
                    let status = crate::status::ApiError::gone(format!(
                        "too old resource version: {cursor} ({compacted})"
                    ));
                    let _ = self.tx.send(Ok(line("ERROR", &status.to_status()))).await;
                    return;
                }
            };
            let got = !batch.is_empty();
            for ev in batch {
                cursor = ev.rv;
                if let Some((kind, obj)) = self.translate(&ev)
                    && !self.send_obj(kind, &obj).await
                {
                    return;
                }
            }
            if got {
                continue;
            }
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            // Biased: a cut signalled before a write must win over that write's notification.
            tokio::select! {
                biased;
                r = cuts.changed() => {
                    let cut = r.is_err()
                        || self.shared.faults.cut_epoch() != epoch
                        || self.shared.faults.is_refused(&self.p.user_agent, &self.p.token);
                    if cut {
                        let _ = self.tx.send(Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "watch cut by fault injection"))).await;
                        return;
                    }
                }
                _ = self.tx.closed() => return,
                r = notify.changed() => if r.is_err() { return },
                _ = sleep => return,
                _ = ticker.tick(), if self.p.bookmarks => {
                    if self.tx.send(Ok(self.bookmark(cursor, false))).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Starts a watch; the returned receiver yields the stream's lines.
pub fn start(shared: Arc<Shared>, t: Target, p: WatchParams) -> mpsc::Receiver<Chunk> {
    let (tx, rx) = mpsc::channel(64);
    let key = t.rt.storage_key();
    let w = Watcher {
        shared: shared.clone(),
        t,
        p,
        tx,
        key,
        sent_table: Default::default(),
    };
    tokio::spawn(w.run());
    rx
}
