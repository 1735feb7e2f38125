//! HTTP/1.1 front: accept loop (TCP_NODELAY), routing of Kubernetes API paths to the verbs,
//! discovery documents, content negotiation (JSON, Table, PartialObjectMetadata), faults, counters
//! and the `/testbed/*` admin endpoint.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};

use crate::faults::{Decision, Partition, RequestInfo, Rule};
use crate::selector::{FieldSelector, LabelSelector, Selectors};
use crate::shared::Shared;
use crate::status::ApiError;
use crate::store::Store;
use crate::table;
use crate::table::metadata_view;
use crate::verbs::{self, DeleteOptions, FieldValidation, PatchKind, Target, WriteOptions};
use crate::watch::{self, WatchParams};

pub type Body = BoxBody<Bytes, std::io::Error>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    bytes_response(code, serde_json::to_vec(v).expect("JSON serializes"))
}

fn object_response(code: u16, o: &crate::store::Object) -> Response<Body> {
    bytes_response(code, o.json.clone())
}

fn bytes_response(code: u16, b: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(full(b));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if e.code == 429 || e.code == 503 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
                {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parsed query string.
#[derive(Debug, Default)]
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Query(
            q.unwrap_or_default()
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (percent_decode(k), percent_decode(v))
                })
                .collect(),
        )
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
}

/// Who is asking.
#[derive(Debug, Clone, Default)]
struct Client {
    user_agent: String,
    token: String,
}

impl Client {
    /// The key of its counters: its bearer token, else its user agent.
    fn who(&self) -> &str {
        if self.token.is_empty() {
            &self.user_agent
        } else {
            &self.token
        }
    }
}

/// `resp`, the answer to a `verb` request, with its body's bytes counted for `who` as they are sent.
fn counting(
    resp: Response<Body>,
    shared: &Arc<Shared>,
    who: &str,
    verb: &'static str,
) -> Response<Body> {
    let (shared, who) = (shared.clone(), who.to_string());
    resp.map(|body| {
        body.map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                shared
                    .counters
                    .record_response_bytes(&who, verb, data.len());
            }
            frame
        })
        .boxed()
    })
}

/// The request was refused (partition): the connection is closed without an answer.
#[derive(Debug, thiserror::Error)]
#[error("client refused by a partition fault")]
pub struct Refused;

/// Serves one request.
pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Refused> {
    let client = Client {
        user_agent: req
            .headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        token: req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default()
            .to_string(),
    };
    let path = req.uri().path().to_string();
    if !path.starts_with("/testbed/") && shared.faults.is_refused(&client.user_agent, &client.token)
    {
        return Err(Refused);
    }
    let method = req.method().clone();
    let started = std::time::Instant::now();
    let resp = match route(&shared, req, &client).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    tracing::debug!(%method, %path, status = resp.status().as_u16(), user_agent = %client.user_agent,
        micros = started.elapsed().as_micros() as u64, "request");
    Ok(resp)
}

async fn read_body(req: Request<Incoming>) -> Result<(http::request::Parts, Bytes), ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?
        .to_bytes();
    Ok((parts, bytes))
}

async fn route(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    client: &Client,
) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let segs: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let query = Query::parse(req.uri().query());
    match segs.as_slice() {
        ["testbed", rest @ ..] => {
            let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            admin(shared, req, &rest).await
        }
        ["version"] => Ok(json_response(200, &version())),
        ["healthz" | "livez" | "readyz", ..] => Ok(bytes_response(200, b"ok".to_vec())),
        ["openapi", "v3"] => Ok(json_response(200, &openapi_root(&shared.lock()))),
        ["openapi", "v3", gv @ ..] => {
            openapi_group_version(&shared.lock(), &gv.join("/")).map(|v| json_response(200, &v))
        }
        ["api"] => Ok(json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.server_address}]}),
        )),
        ["apis"] => Ok(json_response(200, &group_list(&shared.lock()))),
        ["api", "v1"] => Ok(json_response(
            200,
            &resource_list(&shared.lock(), "", "v1")?,
        )),
        ["apis", g] => {
            let list = group_list(&shared.lock());
            let found = list["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|x| x["name"] == *g))
                .cloned();
            match found {
                Some(mut grp) => {
                    grp["kind"] = json!("APIGroup");
                    grp["apiVersion"] = json!("v1");
                    Ok(json_response(200, &grp))
                }
                None => Err(not_found_path()),
            }
        }
        ["apis", g, v] => Ok(json_response(200, &resource_list(&shared.lock(), g, v)?)),
        ["api", "v1", rest @ ..] => {
            resource_request(shared, req, "", "v1", rest, query, client).await
        }
        ["apis", g, v, rest @ ..] => {
            let (g, v) = (g.to_string(), v.to_string());
            resource_request(shared, req, &g, &v, rest, query, client).await
        }
        _ => Err(not_found_path()),
    }
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-netwave-testbed", "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64",
    })
}

/// `/openapi/v3`: one document per group-version. kubectl reads it to learn that the server
/// validates fields itself (`fieldValidation` on PATCH), and then skips client-side validation.
fn openapi_root(st: &Store) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, vs) in st.registry.groups() {
        for v in vs {
            let rel = if g.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{g}/{v}")
            };
            paths.insert(rel.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{rel}?hash={}", st.resource_version())}));
        }
    }
    json!({"paths": paths})
}

fn openapi_group_version(st: &Store, rel: &str) -> Result<Value, ApiError> {
    let (group, version) = match rel.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return Err(not_found_path()),
    };
    let mut paths = serde_json::Map::new();
    for t in st
        .registry
        .all()
        .filter(|t| t.group == group && t.versions.contains(&version))
    {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{prefix}/{}/{{name}}", t.plural)
        };
        let gvk = json!({"group": t.group, "version": version, "kind": t.kind});
        let param = |n: &str| json!({"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        paths.insert(
            path,
            json!({"patch": {
                "operationId": format!("patch{}", t.kind),
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [param("dryRun"), param("fieldManager"), param("fieldValidation"), param("force")],
                "responses": {"200": {"description": "OK"}},
            }}),
        );
    }
    if paths.is_empty() {
        return Err(not_found_path());
    }
    Ok(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"}, "paths": paths, "components": {}}),
    )
}

fn group_list(st: &Store) -> Value {
    let groups: Vec<Value> = st
        .registry
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(st: &Store, group: &str, version: &str) -> Result<Value, ApiError> {
    let resources: Vec<Value> = st
        .registry
        .all()
        .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
        .flat_map(|t| t.discovery())
        .collect();
    if resources.is_empty() {
        return Err(not_found_path());
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// Kubernetes verb and counter key of a request.
fn verb_of(method: &Method, has_name: bool, watch: bool) -> &'static str {
    match (method.as_str(), has_name) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

fn manager_from(query: &Query, client: &Client) -> String {
    match query.get("fieldManager") {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => {
            let prefix = client.user_agent.split('/').next().unwrap_or_default();
            if prefix.is_empty() {
                "unknown".into()
            } else {
                prefix.chars().take(128).collect()
            }
        }
    }
}

fn selectors(query: &Query, rt: &crate::resources::ResourceType) -> Result<Selectors, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())
        .map_err(ApiError::bad_request)?;
    let allowed: Option<&[&str]> = if rt.custom {
        Some(&["metadata.name", "metadata.namespace"])
    } else {
        None
    };
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), allowed)
        .map_err(ApiError::bad_request)?;
    Ok(Selectors { labels, fields })
}

#[allow(clippy::too_many_arguments)]
async fn resource_request(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    group: &str,
    version: &str,
    rest: &[&str],
    query: Query,
    client: &Client,
) -> Result<Response<Body>, ApiError> {
    let (legacy_watch, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let target = resolve_target(shared, group, version, rest)?;
    let watch = legacy_watch || query.flag("watch");
    let verb = verb_of(req.method(), target.name.is_some(), watch);
    admit(shared, &target, verb, client).await?;
    let accept = header_text(&req, header::ACCEPT);
    let content_type = header_text(&req, header::CONTENT_TYPE);
    let (_parts, body) = read_body(req).await?;
    let call = Call {
        shared,
        opts: write_options(shared, &query, client),
        query: &query,
        client,
        t: target,
        as_table: accept.contains("as=Table"),
        as_meta: accept.contains("as=PartialObjectMetadata"),
    };
    let answer = match verb {
        // A watch's events are counted as they are sent (`watch.rs`).
        "watch" => return call.watch(),
        "get" => call.get(),
        "list" => call.list(),
        "create" => call.create(&body),
        "update" => call.update(&body),
        "patch" => call.patch(&content_type, &body),
        "delete" => call.delete(&body),
        "deletecollection" => call.delete_collection(&body),
        _ => Err(ApiError::method_not_allowed()),
    };
    let resp = answer.unwrap_or_else(|e| error_response(&e));
    Ok(counting(resp, shared, client.who(), verb))
}

/// Resolves a resource path (after the group/version) to namespace, resource type, name and
/// subresource; an unknown resource or a malformed path is a 404.
fn resolve_target(
    shared: &Shared,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Target, ApiError> {
    let st = shared.lock();
    let namespaced_path = rest.len() >= 3
        && rest[0] == "namespaces"
        && st
            .registry
            .lookup(group, version, rest[2])
            .is_some_and(|t| t.namespaced);
    let (ns, plural, name, sub) = if namespaced_path {
        (Some(rest[1].to_string()), rest[2], rest.get(3), rest.get(4))
    } else {
        (
            None,
            *rest.first().ok_or_else(not_found_path)?,
            rest.get(1),
            rest.get(2),
        )
    };
    let rt = st
        .registry
        .lookup(group, version, plural)
        .ok_or_else(not_found_path)?;
    if rest.len() > if namespaced_path { 5 } else { 3 } {
        return Err(not_found_path());
    }
    let status = match sub {
        None => false,
        Some(&"status") if rt.status => true,
        Some(_) => return Err(not_found_path()),
    };
    if !rt.namespaced && ns.is_some() {
        return Err(not_found_path());
    }
    Ok(Target {
        rt,
        version: version.to_string(),
        namespace: ns,
        name: name.map(|n| n.to_string()),
        status,
    })
}

/// Counts the request for its client and applies any injected fault (a delay, or a failure the
/// request ends with).
async fn admit(
    shared: &Shared,
    target: &Target,
    verb: &'static str,
    client: &Client,
) -> Result<(), ApiError> {
    let resource = if target.status {
        format!("{}/status", target.rt.plural)
    } else {
        target.rt.plural.clone()
    };
    shared.counters.record_for(client.who(), verb, &resource);
    let info = RequestInfo {
        verb,
        resource: &resource,
        user_agent: &client.user_agent,
        token: &client.token,
    };
    match shared.faults.decide(&info) {
        Decision::Pass => Ok(()),
        Decision::Delay(d) => {
            tokio::time::sleep(d).await;
            Ok(())
        }
        Decision::Fail(code) => {
            let reason = match code {
                429 => "TooManyRequests",
                503 => "ServiceUnavailable",
                _ => "InternalError",
            };
            Err(ApiError::new(
                code,
                reason,
                format!("injected fault: {verb} {resource}"),
            ))
        }
    }
}

fn header_text(req: &Request<Incoming>, name: header::HeaderName) -> String {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

fn write_options(shared: &Shared, query: &Query, client: &Client) -> WriteOptions {
    WriteOptions {
        manager: manager_from(query, client),
        dry_run: query.get("dryRun").is_some_and(|d| d == "All"),
        force: query.flag("force"),
        validation: match query.get("fieldValidation") {
            Some("Strict") => FieldValidation::Strict,
            Some("Ignore") => FieldValidation::Ignore,
            _ => FieldValidation::Warn,
        },
        gc: shared.gc.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// The body's patch kind, from its Content-Type; anything else is a 415.
fn patch_kind(content_type: &str) -> Result<PatchKind, ApiError> {
    let ct = content_type.split(';').next().unwrap_or_default().trim();
    match ct {
        "application/json-patch+json" => Ok(PatchKind::Json),
        "application/merge-patch+json" => Ok(PatchKind::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchKind::Apply),
        _ => Err(ApiError::unsupported_media(
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )),
    }
}

fn delete_options(body: &Bytes) -> Result<DeleteOptions, ApiError> {
    Ok(if body.is_empty() {
        DeleteOptions::default()
    } else {
        DeleteOptions::from_body(&parse_json(body)?)
    })
}

/// One resolved, admitted resource request: the verb handlers below serve it.
struct Call<'a> {
    shared: &'a Arc<Shared>,
    t: Target,
    query: &'a Query,
    client: &'a Client,
    opts: WriteOptions,
    /// `Accept: ...;as=Table`: the response is a Table.
    as_table: bool,
    /// `Accept: ...;as=PartialObjectMetadata`: the response carries metadata only.
    as_meta: bool,
}

impl Call<'_> {
    fn include_object(&self) -> &str {
        self.query.get("includeObject").unwrap_or("Metadata")
    }

    fn get(&self) -> Result<Response<Body>, ApiError> {
        let t = &self.t;
        let obj = verbs::get(&self.shared.lock(), t)?;
        if self.as_table {
            let rv = obj.value()["metadata"]["resourceVersion"].clone();
            Ok(json_response(
                200,
                &table::table(
                    &t.rt,
                    &t.version,
                    &[obj],
                    self.include_object(),
                    json!({"resourceVersion": rv}),
                ),
            ))
        } else if self.as_meta {
            Ok(json_response(200, &metadata_view(&obj.value())))
        } else {
            Ok(object_response(200, &obj))
        }
    }

    fn list(&self) -> Result<Response<Body>, ApiError> {
        let (t, query) = (&self.t, self.query);
        let sel = selectors(query, &t.rt)?;
        let limit = query.get("limit").and_then(|l| l.parse().ok());
        let page = verbs::list(&self.shared.lock(), t, &sel, limit, query.get("continue"))?;
        let mut meta = json!({"resourceVersion": page.resource_version.to_string()});
        if let Some(c) = &page.continue_token {
            meta["continue"] = json!(c);
            meta["remainingItemCount"] = json!(page.remaining.unwrap_or(0));
        }
        if self.as_table {
            return Ok(json_response(
                200,
                &table::table(&t.rt, &t.version, &page.items, self.include_object(), meta),
            ));
        }
        let (kind, api_version) = if self.as_meta {
            (
                "PartialObjectMetadataList".to_string(),
                "meta.k8s.io/v1".to_string(),
            )
        } else {
            (format!("{}List", t.rt.kind), t.rt.api_version(&t.version))
        };
        let mut out = Vec::with_capacity(256 + page.items.len() * 512);
        out.extend_from_slice(
            format!("{{\"kind\":\"{kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":")
                .as_bytes(),
        );
        serde_json::to_writer(&mut out, &meta).expect("JSON serializes");
        out.extend_from_slice(b",\"items\":[");
        for (i, o) in page.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            if self.as_meta {
                serde_json::to_writer(&mut out, &metadata_view(&o.value()))
                    .expect("JSON serializes");
            } else {
                out.extend_from_slice(&o.json);
            }
        }
        out.extend_from_slice(b"]}");
        Ok(bytes_response(200, out))
    }

    fn watch(self) -> Result<Response<Body>, ApiError> {
        let query = self.query;
        let sel = selectors(query, &self.t.rt)?;
        let bookmarks = query.flag("allowWatchBookmarks");
        let send_initial = query.get("sendInitialEvents").map(|v| v == "true");
        if send_initial == Some(true) && !bookmarks {
            return Err(ApiError::new(
                422,
                "Invalid",
                "sendInitialEvents requires allowWatchBookmarks=true",
            ));
        }
        let p = WatchParams {
            resource_version: query.get("resourceVersion").map(String::from),
            bookmarks,
            timeout: query
                .get("timeoutSeconds")
                .and_then(|s| s.parse().ok())
                .map(Duration::from_secs),
            send_initial_events: send_initial,
            selectors: sel,
            metadata_only: self.as_meta,
            table: self.as_table.then(|| self.include_object().to_string()),
            user_agent: self.client.user_agent.clone(),
            token: self.client.token.clone(),
        };
        let rx = watch::start(self.shared.clone(), self.t, p);
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
                .map(|c| c.map(Frame::data));
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r.headers_mut().insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        Ok(r)
    }

    fn create(&self, body: &Bytes) -> Result<Response<Body>, ApiError> {
        let v = parse_json(body)?;
        let w = self
            .shared
            .write(|st| verbs::create(st, &self.t, v, &self.opts))?;
        Ok(with_warnings(
            object_response(
                if w.created { 201 } else { 200 },
                &verbs::present(&w.object, &self.t),
            ),
            &w.warnings,
        ))
    }

    fn update(&self, body: &Bytes) -> Result<Response<Body>, ApiError> {
        let v = parse_json(body)?;
        let w = self
            .shared
            .write(|st| verbs::replace(st, &self.t, v, &self.opts))?;
        Ok(with_warnings(
            object_response(200, &verbs::present(&w.object, &self.t)),
            &w.warnings,
        ))
    }

    fn patch(&self, content_type: &str, body: &Bytes) -> Result<Response<Body>, ApiError> {
        let kind = patch_kind(content_type)?;
        let w = self
            .shared
            .write(|st| verbs::patch(st, &self.t, kind, body, &self.opts))?;
        let code = if w.created { 201 } else { 200 };
        Ok(with_warnings(
            object_response(code, &verbs::present(&w.object, &self.t)),
            &w.warnings,
        ))
    }

    fn delete(&self, body: &Bytes) -> Result<Response<Body>, ApiError> {
        let mut del = delete_options(body)?;
        if self.query.get("propagationPolicy") == Some("Orphan") {
            del.orphan = true;
        }
        let obj = self
            .shared
            .write(|st| verbs::delete(st, &self.t, &del, &self.opts))?;
        Ok(object_response(200, &verbs::present(&obj, &self.t)))
    }

    fn delete_collection(&self, body: &Bytes) -> Result<Response<Body>, ApiError> {
        let t = &self.t;
        let sel = selectors(self.query, &t.rt)?;
        let del = delete_options(body)?;
        let items = self.shared.write(|st| -> Result<Vec<Value>, ApiError> {
            let page = verbs::list(st, t, &sel, None, None)?;
            let mut out = Vec::new();
            for o in page.items {
                let one = Target {
                    name: Some(o.name.clone()),
                    namespace: o.namespace.clone(),
                    ..t.clone()
                };
                out.push(verbs::delete(st, &one, &del, &self.opts)?.value());
            }
            Ok(out)
        })?;
        Ok(json_response(
            200,
            &json!({"kind": format!("{}List", t.rt.kind), "apiVersion": t.rt.api_version(&t.version), "metadata": {}, "items": items}),
        ))
    }
}

fn with_warnings(mut r: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the body of the request is not valid JSON: {e}"))
    })
}

/// `/testbed/*`: fault rules, partitions, watch cuts, counters, history compaction.
async fn admin(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    rest: &[String],
) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    let (_, body) = read_body(req).await?;
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    match (method.as_str(), rest.as_slice()) {
        ("GET", ["counters"]) => Ok(json_response(200, &shared.counters.snapshot().to_json())),
        // `{"<client>": {"patch nodes": 3, ...}}`: a client is its bearer token, else its user agent.
        ("GET", ["counters", "clients"]) => {
            let by_client = shared.counters.by_client();
            let body: serde_json::Map<String, serde_json::Value> = by_client
                .iter()
                .map(|(c, counts)| (c.clone(), counts.to_json()))
                .collect();
            Ok(json_response(200, &serde_json::Value::Object(body)))
        }
        // `{"<client>": {"responseBytes": {"patch": 123}, "watchEvents": {"nodenetworkconfigs": 4},
        // "watchEventBytes": {...}}}`: what the server sent each client (faults::Traffic).
        ("GET", ["counters", "traffic"]) => Ok(json_response(
            200,
            &serde_json::to_value(shared.counters.traffic()).unwrap_or_default(),
        )),
        ("DELETE", ["counters"]) => {
            shared.counters.reset();
            Ok(json_response(200, &json!({})))
        }
        ("GET", ["faults"]) => Ok(json_response(
            200,
            &serde_json::to_value(shared.faults.rules()).unwrap_or_default(),
        )),
        ("POST", ["faults"]) => {
            let rule: Rule = serde_json::from_slice(&body)
                .map_err(|e| ApiError::bad_request(format!("fault rule: {e}")))?;
            shared.faults.add(rule);
            Ok(json_response(201, &json!({})))
        }
        ("DELETE", ["faults"]) => {
            shared.faults.clear();
            Ok(json_response(200, &json!({})))
        }
        ("POST", ["partition"]) => {
            let p: Partition = serde_json::from_slice(&body)
                .map_err(|e| ApiError::bad_request(format!("partition: {e}")))?;
            shared.faults.partition(p);
            Ok(json_response(201, &json!({})))
        }
        ("DELETE", ["partition"]) => {
            shared.faults.heal();
            Ok(json_response(200, &json!({})))
        }
        ("POST", ["cut-watches"]) => {
            shared.faults.cut_watches();
            Ok(json_response(200, &json!({})))
        }
        ("POST", ["compact"]) => {
            shared.write(|st| st.compact());
            Ok(json_response(200, &json!({})))
        }
        _ => Err(not_found_path()),
    }
}
