//! The API verbs on the store, with the real server's object semantics: resourceVersion
//! preconditions, uid/creationTimestamp, generation on spec changes, status isolation,
//! finalizers, schema enforcement, managedFields, garbage collection.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::events;
use crate::resources::{self, ResourceType};
use crate::schema;
use crate::selector::Selectors;
use crate::ssa::{self, Scope, Writer};
use crate::status::{ApiError, Cause};
use crate::store::{Object, Store, object_key};

/// The object or collection a request addresses.
#[derive(Debug, Clone)]
pub struct Target {
    pub rt: Arc<ResourceType>,
    pub version: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Addresses the `/status` subresource.
    pub status: bool,
}

impl Target {
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    fn key(&self) -> String {
        object_key(self.namespace.as_deref(), self.name())
    }

    fn api_version(&self) -> String {
        self.rt.api_version(&self.version)
    }

    fn scope(&self) -> Scope {
        match (self.rt.status, self.status) {
            (true, true) => Scope::Status,
            (true, false) => Scope::Main,
            _ => Scope::All,
        }
    }
}

/// `fieldValidation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

/// Options of a write.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub manager: String,
    pub dry_run: bool,
    pub force: bool,
    pub validation: FieldValidation,
    /// Garbage-collect dependents (ownerReferences) on delete.
    pub gc: bool,
}

/// A successful write.
#[derive(Debug)]
pub struct Written {
    pub object: Arc<Object>,
    pub created: bool,
    pub warnings: Vec<String>,
}

/// Patch content types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

/// RFC 3339 seconds, as `metav1.Time`.
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Presents a stored object in the requested version.
pub fn present(obj: &Arc<Object>, t: &Target) -> Arc<Object> {
    let want = t.api_version();
    if t.rt.is_events_v1() && obj.api_version == "v1" {
        Arc::new(Object::from_value(&events::from_core(&obj.value())))
    } else if obj.api_version == want {
        obj.clone()
    } else {
        let mut o = obj.value();
        o["apiVersion"] = json!(want);
        Arc::new(Object::from_value(&o))
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A label or annotation key: `[prefix/]name`, the prefix a DNS subdomain.
fn is_qualified_name(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_qualified_part(name),
        None => is_qualified_part(k),
    }
}

/// Label and annotation syntax, as the real server checks it on every write.
fn metadata_errors(meta: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let invalid = |field: String, v: &str, why: &str| Cause {
        reason: "FieldValueInvalid".into(),
        message: format!("Invalid value: \"{v}\": {why}"),
        field,
    };
    const NAME: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
    if let Some(labels) = meta["labels"].as_object() {
        for (k, v) in labels {
            if !is_qualified_name(k) {
                out.push(invalid("metadata.labels".into(), k, NAME));
            }
            let v = v.as_str().unwrap_or_default();
            if !v.is_empty() && !is_qualified_part(v) {
                out.push(invalid(
                    format!("metadata.labels.{k}"),
                    v,
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters)",
                ));
            }
        }
    }
    if let Some(annotations) = meta["annotations"].as_object() {
        for k in annotations.keys() {
            if !is_qualified_name(&k.to_lowercase()) {
                out.push(invalid("metadata.annotations".into(), k, NAME));
            }
        }
    }
    out
}

pub fn get(st: &Store, t: &Target) -> Result<Arc<Object>, ApiError> {
    st.get(&t.rt, &t.key())
        .map(|o| present(&o, t))
        .ok_or_else(|| ApiError::not_found(&t.rt, t.name()))
}

/// events.k8s.io/v1 Events are written through core/v1's storage: the core target, if `t` is one.
fn events_core_target(st: &Store, t: &Target) -> Option<Target> {
    if !t.rt.is_events_v1() {
        return None;
    }
    let core = st.registry.get("/events")?;
    Some(Target {
        rt: core,
        version: "v1".into(),
        ..t.clone()
    })
}

/// Continue tokens: hex of `rv/key`, opaque to clients.
fn encode_continue(rv: u64, key: &str) -> String {
    format!("{rv}/{key}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(s: &str) -> Option<(u64, String)> {
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let (rv, key) = text.split_once('/')?;
    Some((rv.parse().ok()?, key.to_string()))
}

/// A page of a list.
pub struct Page {
    pub items: Vec<Arc<Object>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

pub fn list(
    st: &Store,
    t: &Target,
    sel: &Selectors,
    limit: Option<usize>,
    cont: Option<&str>,
) -> Result<Page, ApiError> {
    let (rv, after) = match cont.filter(|c| !c.is_empty()) {
        Some(c) => {
            let (rv, key) = decode_continue(c)
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            if rv < st.compacted() || rv > st.resource_version() {
                return Err(ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, Some(key))
        }
        None => (st.resource_version(), None),
    };
    let limit = limit.filter(|l| *l > 0);
    let mut items = Vec::new();
    let mut last_key = None;
    let mut more = false;
    let mut remaining = 0usize;
    if let (Some(name), None) = (sel.fields.single_name(), &after) {
        // Fast path for the single-object watchers/lists (`metadata.name=<x>`).
        let key = object_key(t.namespace.as_deref(), name);
        if let Some(o) = st.get(&t.rt, &key).filter(|o| sel.matches_object(o)) {
            items.push(present(&o, t));
        }
    } else {
        for (k, o) in st.range(&t.rt, t.namespace.as_deref(), after.as_deref()) {
            if !sel.matches_object(o) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                remaining += 1;
                continue;
            }
            items.push(present(o, t));
            last_key = Some(k.clone());
        }
    }
    let continue_token = if more {
        last_key.map(|k| encode_continue(rv, &k))
    } else {
        None
    };
    Ok(Page {
        items,
        resource_version: rv,
        remaining: more.then_some(remaining),
        continue_token,
    })
}

fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

/// Whether `a` and `b` hold the same fields, the `skip`ped keys aside, each pair compared by `eq`
/// (given the key); values that are not both objects compare whole. Compared in place: a write must
/// not copy its object to compare it (cloning both objects to strip fields was a tenth of the
/// testbed's CPU at 15,000 nodes).
fn same_fields(
    a: &Value,
    b: &Value,
    skip: &[&str],
    eq: impl Fn(&str, &Value, &Value) -> bool,
) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let kept = |m: &serde_json::Map<String, Value>| {
        m.keys().filter(|k| !skip.contains(&k.as_str())).count()
    };
    kept(a) == kept(b)
        && (a.iter().filter(|(k, _)| !skip.contains(&k.as_str())))
            .all(|(k, x)| b.get(k).is_some_and(|y| eq(k, x, y)))
}

/// Whether `a` and `b` differ in nothing but metadata, status, apiVersion and kind (the spec, for
/// the generation).
fn same_but_meta_status(a: &Value, b: &Value) -> bool {
    same_fields(
        a,
        b,
        &["metadata", "status", "apiVersion", "kind"],
        |_, x, y| x == y,
    )
}

/// A write that changes nothing but the resourceVersion and managedFields timestamps is a no-op (no
/// new resourceVersion, no event); a change of ownership alone is a real write, as on kube-apiserver.
fn same_ignoring_bookkeeping(a: &Value, b: &Value) -> bool {
    same_fields(a, b, &[], |k, x, y| match k {
        "metadata" => same_fields(x, y, &["resourceVersion"], |k, x, y| match k {
            "managedFields" => same_entries_but_time(x, y),
            _ => x == y,
        }),
        _ => x == y,
    })
}

/// Two managedFields lists that differ at most in their entries' `time`.
fn same_entries_but_time(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_array(), b.as_array()) else {
        return a == b;
    };
    a.len() == b.len()
        && (a.iter().zip(b)).all(|(x, y)| same_fields(x, y, &["time"], |_, x, y| x == y))
}

/// The part of every write after the verb computed the new object.
struct Commit<'a> {
    old: Option<Arc<Object>>,
    /// `old` already parsed by the verb (parsing a stored object again was a tenth of the testbed's
    /// CPU at 15,000 nodes); `None`: parsed here.
    old_value: Option<Value>,
    /// managedFields already computed (server-side apply).
    preset_managed: bool,
    /// An empty resourceVersion is refused (update of a custom resource).
    require_rv: bool,
    opts: &'a WriteOptions,
}

fn commit(
    st: &mut Store,
    t: &Target,
    mut new: Value,
    mut c: Commit<'_>,
) -> Result<Written, ApiError> {
    let name = t.name().to_string();
    new["apiVersion"] = json!(t.api_version());
    new["kind"] = json!(t.rt.kind);
    let now = now();
    let old_value = c
        .old_value
        .take()
        .or_else(|| c.old.as_ref().map(|o| o.value()));
    match &old_value {
        None => init_created(st, t, &mut new, &now),
        Some(old) => carry_over(t, &mut new, old, &c)?,
    }
    let warnings = enforce_schema(t, &mut new, c.opts.validation)?;
    check_name_and_metadata(&t.rt, &name, &new)?;
    let defined = if t.rt.is_crd() {
        Some(define_crd(st, t, &mut new, old_value.as_ref(), &now)?)
    } else {
        None
    };
    if let Some(old) = &old_value {
        bump_generation(&t.rt, old, &mut new);
    }
    if !c.preset_managed {
        let api_version = t.api_version();
        let writer = Writer {
            manager: &c.opts.manager,
            subresource: if t.status { "status" } else { "" },
            api_version: &api_version,
            time: &now,
            scope: t.scope(),
            lists: &t.rt.lists,
        };
        ssa::record_update(old_value.as_ref(), &mut new, &writer);
    }
    if let (Some(old), Some(old_v)) = (&c.old, &old_value)
        && same_ignoring_bookkeeping(old_v, &new)
    {
        return Ok(Written {
            object: old.clone(),
            created: false,
            warnings,
        });
    }
    Ok(store_written(st, t, new, &c, defined, warnings))
}

/// A new object's server-set metadata (uid, creation time, generation) and initial status.
fn init_created(st: &mut Store, t: &Target, new: &mut Value, now: &str) {
    let rt = &t.rt;
    let uid = st.new_uid();
    let m = meta_mut(new);
    m.insert("uid".into(), json!(uid));
    m.insert("creationTimestamp".into(), json!(now));
    m.remove("deletionTimestamp");
    m.remove("deletionGracePeriodSeconds");
    m.remove("resourceVersion");
    if rt.generation {
        m.insert("generation".into(), json!(1));
    } else {
        m.remove("generation");
    }
    if rt.status && rt.custom && !t.status {
        new.as_object_mut().map(|o| o.remove("status"));
    }
    if rt.is_namespace() {
        new["status"] = json!({"phase": "Active"});
    }
}

/// An update of `old`: the resourceVersion precondition, status from the right side of the
/// subresource split, the server-owned metadata kept, and no finalizer added while deleting.
fn carry_over(t: &Target, new: &mut Value, old: &Value, c: &Commit<'_>) -> Result<(), ApiError> {
    let (rt, name) = (&t.rt, t.name());
    let body_rv = new["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if !body_rv.is_empty() && Some(body_rv.as_str()) != old["metadata"]["resourceVersion"].as_str()
    {
        return Err(ApiError::stale(rt, name));
    }
    if body_rv.is_empty() && c.require_rv {
        return Err(ApiError::invalid(
            rt,
            name,
            vec![Cause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: 0x0: must be specified for an update".into(),
                field: "metadata.resourceVersion".into(),
            }],
        ));
    }
    split_status(t, new, old, c.preset_managed);
    let keep = [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "name",
        "namespace",
        "resourceVersion",
    ];
    let old_meta = old["metadata"].as_object().cloned().unwrap_or_default();
    let m = meta_mut(new);
    for k in keep {
        match old_meta.get(k) {
            Some(v) => m.insert(k.into(), v.clone()),
            None => m.remove(k),
        };
    }
    if old_meta.contains_key("deletionTimestamp") {
        let before: Vec<&Value> = old_meta
            .get("finalizers")
            .and_then(|f| f.as_array())
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        let added = m
            .get("finalizers")
            .and_then(|f| f.as_array())
            .is_some_and(|a| a.iter().any(|f| !before.contains(&f)));
        if added {
            return Err(ApiError::invalid(
                rt,
                name,
                vec![Cause {
                    reason: "FieldValueForbidden".into(),
                    message:
                        "Forbidden: no new finalizers can be added if the object is being deleted"
                            .into(),
                    field: "metadata.finalizers".into(),
                }],
            ));
        }
    }
    Ok(())
}

/// The status subresource changes status only; the main resource keeps the stored status.
fn split_status(t: &Target, new: &mut Value, old: &Value, preset_managed: bool) {
    if t.status {
        let status = new.get("status").cloned();
        let managed = new["metadata"].get("managedFields").cloned();
        *new = old.clone();
        if preset_managed && let Some(m) = managed {
            new["metadata"]["managedFields"] = m;
        }
        match status {
            Some(s) => new["status"] = s,
            None => {
                new.as_object_mut().map(|o| o.remove("status"));
            }
        }
    } else if t.rt.status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                new.as_object_mut().map(|o| o.remove("status"));
            }
        }
    }
}

/// Schema: prune, default, validate. Returns the warnings for pruned fields (or refuses them
/// under strict field validation).
fn enforce_schema(
    t: &Target,
    new: &mut Value,
    validation: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    let mut warnings = Vec::new();
    let Some(schema) = t.rt.schemas.get(&t.version) else {
        return Ok(warnings);
    };
    let out = schema::enforce(schema, new);
    if !out.pruned.is_empty() {
        match validation {
            FieldValidation::Strict => {
                let list: Vec<String> = out
                    .pruned
                    .iter()
                    .map(|p| format!("unknown field \"{p}\""))
                    .collect();
                return Err(ApiError::bad_request(format!(
                    "strict decoding error: {}",
                    list.join(", ")
                )));
            }
            FieldValidation::Warn => {
                warnings.extend(out.pruned.iter().map(|p| format!("unknown field \"{p}\"")))
            }
            FieldValidation::Ignore => {}
        }
    }
    if !out.errors.is_empty() {
        return Err(ApiError::invalid(&t.rt, t.name(), out.errors));
    }
    Ok(warnings)
}

fn check_name_and_metadata(rt: &ResourceType, name: &str, new: &Value) -> Result<(), ApiError> {
    let event_name_ok = rt.plural == "events"; // event names carry a dot-hex suffix, any case
    if !is_dns_subdomain(name) && !event_name_ok {
        return Err(ApiError::invalid(
            rt,
            name,
            vec![Cause {
                reason: "FieldValueInvalid".into(),
                message: format!(
                    "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
                field: "metadata.name".into(),
            }],
        ));
    }
    let meta_errors = metadata_errors(&new["metadata"]);
    if !meta_errors.is_empty() {
        return Err(ApiError::invalid(rt, name, meta_errors));
    }
    Ok(())
}

/// A CRD is checked and accepted as the apiextensions server would; returns the resource type
/// it defines (registered once the CRD is stored).
fn define_crd(
    st: &Store,
    t: &Target,
    new: &mut Value,
    old: Option<&Value>,
    now: &str,
) -> Result<ResourceType, ApiError> {
    let (rt, name) = (&t.rt, t.name());
    let d = resources::from_crd(new).map_err(|(field, message)| {
        ApiError::invalid(
            rt,
            name,
            vec![Cause {
                reason: "FieldValueInvalid".into(),
                message,
                field,
            }],
        )
    })?;
    if let Some(other) = st.registry.get(&d.key())
        && !other.custom
    {
        return Err(ApiError::invalid(
            rt,
            name,
            vec![Cause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: built-in resource".into(),
                field: "spec.names.plural".into(),
            }],
        ));
    }
    // Conditions keep their transition times across updates (no spurious changes).
    let conditions = old
        .map(|o| o["status"]["conditions"].clone())
        .filter(|c| c.is_array());
    new["status"] = json!({
        "acceptedNames": new["spec"]["names"],
        "storedVersions": [d.versions.first()],
        "conditions": conditions.unwrap_or_else(|| json!([
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ])),
    });
    Ok(d)
}

/// metadata.generation moves when anything but metadata and status changed.
fn bump_generation(rt: &ResourceType, old: &Value, new: &mut Value) {
    if rt.generation && !same_but_meta_status(old, new) {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
        new["metadata"]["generation"] = json!(g);
    }
}

/// Stores the checked object: nothing on a dry run, a removal once a deleting object has no
/// finalizers left, else a put (and the resource type a CRD defines registered).
fn store_written(
    st: &mut Store,
    t: &Target,
    new: Value,
    c: &Commit<'_>,
    defined: Option<ResourceType>,
    warnings: Vec<String>,
) -> Written {
    let rt = &t.rt;
    let key = t.key();
    let finished = new["metadata"].get("deletionTimestamp").is_some()
        && new["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty());
    if c.opts.dry_run {
        return Written {
            object: Arc::new(Object::from_value(&new)),
            created: c.old.is_none(),
            warnings,
        };
    }
    if finished {
        let last = st
            .remove(rt, &key)
            .unwrap_or_else(|| Arc::new(Object::from_value(&new)));
        after_removal(st, rt, &last, c.opts.gc);
        return Written {
            object: last,
            created: false,
            warnings,
        };
    }
    let created = c.old.is_none();
    let stored = st.put(rt, &key, new);
    if let Some(d) = defined {
        if let Some(old_def) = st.registry.get(&d.key())
            && old_def.namespaced != d.namespaced
        {
            st.drop_resource(&old_def);
        }
        st.registry.register(d);
    }
    Written {
        object: stored,
        created,
        warnings,
    }
}

pub fn create(
    st: &mut Store,
    t: &Target,
    body: Value,
    opts: &WriteOptions,
) -> Result<Written, ApiError> {
    if let Some(core) = events_core_target(st, t) {
        return create_with(st, &core, events::to_core(&body), opts, false);
    }
    create_with(st, t, body, opts, false)
}

fn create_with(
    st: &mut Store,
    t: &Target,
    mut body: Value,
    opts: &WriteOptions,
    preset_managed: bool,
) -> Result<Written, ApiError> {
    let rt = t.rt.clone();
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object",
        ));
    }
    if let Some(k) = body["kind"].as_str()
        && k != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({})",
            body["apiVersion"].as_str().unwrap_or_default(),
            t.api_version()
        )));
    }
    let ns_body = body["metadata"]["namespace"].as_str().map(String::from);
    if rt.namespaced {
        let ns = t
            .namespace
            .clone()
            .ok_or_else(|| ApiError::bad_request("the namespace of the object is required"))?;
        if ns_body.as_deref().is_some_and(|b| b != ns) {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        meta_mut(&mut body).insert("namespace".into(), json!(ns));
        let ns_type = st
            .registry
            .get("/namespaces")
            .expect("namespaces is built in");
        if st.get(&ns_type, &ns).is_none() {
            return Err(ApiError::namespace_not_found(&ns));
        }
    } else {
        meta_mut(&mut body).remove("namespace");
    }
    let mut name = body["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        if let Some(g) = body["metadata"]["generateName"].as_str() {
            name = format!("{g}{}", st.random_suffix());
            meta_mut(&mut body).insert("name".into(), json!(name));
        } else {
            return Err(ApiError::invalid(
                &rt,
                "",
                vec![Cause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value: name or generateName is required".into(),
                    field: "metadata.name".into(),
                }],
            ));
        }
    }
    let t = Target {
        name: Some(name.clone()),
        ..t.clone()
    };
    if st.get(&rt, &t.key()).is_some() {
        return Err(ApiError::already_exists(&rt, &name));
    }
    commit(
        st,
        &t,
        body,
        Commit {
            old: None,
            old_value: None,
            preset_managed,
            require_rv: false,
            opts,
        },
    )
}

fn load_live(st: &Store, t: &Target) -> Result<Arc<Object>, ApiError> {
    st.get(&t.rt, &t.key())
        .ok_or_else(|| ApiError::not_found(&t.rt, t.name()))
}

pub fn replace(
    st: &mut Store,
    t: &Target,
    body: Value,
    opts: &WriteOptions,
) -> Result<Written, ApiError> {
    if let Some(core) = events_core_target(st, t) {
        return replace(st, &core, events::to_core(&body), opts);
    }
    if let Some(n) = body["metadata"]["name"].as_str()
        && n != t.name()
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({})",
            t.name()
        )));
    }
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object",
        ));
    }
    let old = load_live(st, t)?;
    let require_rv = t.rt.custom;
    commit(
        st,
        t,
        body,
        Commit {
            old: Some(old),
            old_value: None,
            preset_managed: false,
            require_rv,
            opts,
        },
    )
}

fn parse_apply_body(body: &[u8]) -> Result<Value, ApiError> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Ok(v);
    }
    let text =
        std::str::from_utf8(body).map_err(|_| ApiError::bad_request("apply body is not UTF-8"))?;
    serde_saphyr::from_str::<Value>(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

pub fn patch(
    st: &mut Store,
    t: &Target,
    kind: PatchKind,
    body: &[u8],
    opts: &WriteOptions,
) -> Result<Written, ApiError> {
    let rt = t.rt.clone();
    if kind == PatchKind::Strategic && rt.custom {
        return Err(ApiError::unsupported_media(
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ));
    }
    let core = events_core_target(st, t);
    if kind == PatchKind::Apply {
        return match &core {
            Some(core) => {
                let applied = events::to_core(&parse_apply_body(body)?);
                let bytes = serde_json::to_vec(&applied).expect("JSON serializes");
                apply(st, core, &bytes, opts)
            }
            None => apply(st, t, body, opts),
        };
    }
    let live = load_live(st, core.as_ref().unwrap_or(t))?;
    // Patches address the requested version's shape.
    let live_v = live.value();
    let mut doc = match &core {
        Some(_) => events::from_core(&live_v),
        None => live_v.clone(),
    };
    match kind {
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(&mut doc, &ops).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
        }
        PatchKind::Merge | PatchKind::Strategic => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid merge patch: {e}")))?;
            if !p.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            // Strategic merge on built-ins merges associative lists by key (Node conditions);
            // `$patch` directives are dropped.
            let mut p = p;
            strip_directives(&mut p);
            if kind == PatchKind::Strategic {
                ssa::strategic_merge(&mut doc, &p, &t.rt.lists);
            } else {
                json_patch::merge(&mut doc, &p);
            }
        }
        PatchKind::Apply => unreachable!("handled above"),
    }
    let (t, doc) = match &core {
        Some(core) => (core, events::to_core(&doc)),
        None => (t, doc),
    };
    commit(
        st,
        t,
        doc,
        Commit {
            old: Some(live),
            old_value: Some(live_v),
            preset_managed: false,
            require_rv: false,
            opts,
        },
    )
}

fn strip_directives(v: &mut Value) {
    if let Some(m) = v.as_object_mut() {
        m.retain(|k, _| !k.starts_with("$setElementOrder") && k != "$patch" && k != "$retainKeys");
        for c in m.values_mut() {
            strip_directives(c);
        }
    }
}

fn apply(
    st: &mut Store,
    t: &Target,
    body: &[u8],
    opts: &WriteOptions,
) -> Result<Written, ApiError> {
    let rt = t.rt.clone();
    let mut applied = parse_apply_body(body)?;
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "the apply configuration is not an object",
        ));
    }
    if opts.manager.is_empty() {
        return Err(ApiError::bad_request(
            "PATCH /apply requires fieldManager to be set",
        ));
    }
    if applied["apiVersion"].as_str().is_none_or(|a| a.is_empty())
        || applied["kind"].as_str().is_none_or(|k| k.is_empty())
    {
        return Err(ApiError::bad_request(
            "invalid object type: apiVersion and kind must be set",
        ));
    }
    if applied["kind"].as_str() != Some(rt.kind.as_str()) {
        return Err(ApiError::bad_request(format!(
            "the kind of the applied object ({}) does not match the resource ({})",
            applied["kind"].as_str().unwrap_or_default(),
            rt.kind
        )));
    }
    match applied["metadata"]["name"].as_str() {
        Some(n) if n != t.name() => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({})",
                t.name()
            )));
        }
        Some(_) => {}
        None => {
            meta_mut(&mut applied).insert("name".into(), json!(t.name()));
        }
    }
    if let Some(ns) = &t.namespace {
        meta_mut(&mut applied).insert("namespace".into(), json!(ns));
    }
    let api_version = t.api_version();
    let now = now();
    let subresource = if t.status { "status" } else { "" };
    let writer = Writer {
        manager: &opts.manager,
        subresource,
        api_version: &api_version,
        time: &now,
        scope: t.scope(),
        lists: &t.rt.lists,
    };
    // Compare values with schema defaults applied (the live object has them).
    let mut defaulted = applied.clone();
    if let Some(schema) = rt.schemas.get(&t.version) {
        let _ = schema::enforce(schema, &mut defaulted);
    }
    let live = st.get(&rt, &t.key());
    match live {
        None => {
            if t.status {
                return Err(ApiError::not_found(&rt, t.name()));
            }
            let merged = ssa::apply(None, applied, Some(&defaulted), opts.force, &writer)
                .map_err(|c| ApiError::apply_conflict(&rt, t.name(), &c))?;
            create_with(st, t, merged, opts, true)
        }
        Some(live) => {
            let live_v = live.value();
            let merged = ssa::apply(
                Some(&live_v),
                applied,
                Some(&defaulted),
                opts.force,
                &writer,
            )
            .map_err(|c| ApiError::apply_conflict(&rt, t.name(), &c))?;
            commit(
                st,
                t,
                merged,
                Commit {
                    old: Some(live),
                    old_value: Some(live_v),
                    preset_managed: true,
                    require_rv: false,
                    opts,
                },
            )
        }
    }
}

/// Delete options from the request body.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// `Orphan` keeps dependents.
    pub orphan: bool,
}

impl DeleteOptions {
    pub fn from_body(v: &Value) -> Self {
        DeleteOptions {
            uid: v["preconditions"]["uid"].as_str().map(String::from),
            resource_version: v["preconditions"]["resourceVersion"]
                .as_str()
                .map(String::from),
            orphan: v["propagationPolicy"].as_str() == Some("Orphan")
                || v["orphanDependents"].as_bool() == Some(true),
        }
    }
}

pub fn delete(
    st: &mut Store,
    t: &Target,
    del: &DeleteOptions,
    opts: &WriteOptions,
) -> Result<Arc<Object>, ApiError> {
    let rt = t.rt.clone();
    let live = load_live(st, t)?;
    let live_v = live.value();
    let meta = &live_v["metadata"];
    if let Some(uid) = &del.uid
        && live.uid != *uid
    {
        return Err(ApiError::conflict(
            &rt,
            t.name(),
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                live.uid
            ),
        ));
    }
    if let Some(rv) = &del.resource_version
        && meta["resourceVersion"].as_str() != Some(rv.as_str())
    {
        return Err(ApiError::conflict(
            &rt,
            t.name(),
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta["resourceVersion"].as_str().unwrap_or_default()
            ),
        ));
    }
    let has_finalizers = meta["finalizers"].as_array().is_some_and(|f| !f.is_empty());
    if has_finalizers {
        if meta.get("deletionTimestamp").is_some() {
            return Ok(present(&live, t));
        }
        let mut o = live_v.clone();
        o["metadata"]["deletionTimestamp"] = json!(now());
        o["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        if rt.generation {
            o["metadata"]["generation"] = json!(meta["generation"].as_i64().unwrap_or(1) + 1);
        }
        if opts.dry_run {
            return Ok(Arc::new(Object::from_value(&o)));
        }
        return Ok(st.put(&rt, &t.key(), o));
    }
    if opts.dry_run {
        return Ok(live);
    }
    let last = st.remove(&rt, &t.key()).unwrap_or(live);
    let gc = opts.gc && !del.orphan;
    after_removal(st, &rt, &last, gc);
    Ok(last)
}

/// What follows an object's removal: a CRD stops serving its resource, a namespace's contents go,
/// dependents are collected.
fn after_removal(st: &mut Store, rt: &ResourceType, last: &Object, gc: bool) {
    if rt.is_crd()
        && let Ok(d) = resources::from_crd(&last.value())
        && let Some(served) = st.registry.get(&d.key())
    {
        st.drop_resource(&served);
        st.registry.unregister(&d.key());
    }
    if rt.is_namespace() {
        let prefix = format!("{}/", last.name);
        let doomed: Vec<(String, String)> = st
            .all_objects()
            .into_iter()
            .filter(|(_, k, _)| k.starts_with(&prefix))
            .map(|(r, k, _)| (r, k))
            .collect();
        for (r, k) in doomed {
            if let Some(t) = st.registry.get(&r) {
                st.remove(&t, &k);
            }
        }
    }
    if gc && !last.uid.is_empty() {
        collect_dependents(st, &last.uid);
    }
}

/// Background garbage collection: dependents whose every owner is gone are deleted (their own
/// finalizers honoured); dependents with other live owners lose only this ownerReference.
fn collect_dependents(st: &mut Store, owner_uid: &str) {
    let all = st.all_objects();
    let dependents: Vec<&(String, String, Arc<Object>)> = all
        .iter()
        .filter(|(_, _, o)| o.owners.iter().any(|u| u == owner_uid))
        .collect();
    if dependents.is_empty() {
        return;
    }
    let live_uids: std::collections::HashSet<&str> =
        all.iter().map(|(_, _, o)| o.uid.as_str()).collect();
    for (r, _, obj) in dependents {
        let Some(rt) = st.registry.get(r) else {
            continue;
        };
        let others_alive = obj
            .owners
            .iter()
            .any(|u| u != owner_uid && live_uids.contains(u.as_str()));
        let version = obj
            .api_version
            .rsplit('/')
            .next()
            .unwrap_or("v1")
            .to_string();
        let t = Target {
            rt: rt.clone(),
            version,
            namespace: obj.namespace.clone(),
            name: Some(obj.name.clone()),
            status: false,
        };
        let opts = WriteOptions {
            manager: "kube-controller-manager".into(),
            gc: true,
            ..WriteOptions::default()
        };
        if others_alive {
            let mut o = obj.value();
            let refs = o["metadata"]["ownerReferences"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let kept: Vec<Value> = refs
                .into_iter()
                .filter(|x| x["uid"].as_str() != Some(owner_uid))
                .collect();
            o["metadata"]["ownerReferences"] = json!(kept);
            let _ = commit(
                st,
                &t,
                o,
                Commit {
                    old: Some(obj.clone()),
                    old_value: None,
                    preset_managed: false,
                    require_rv: false,
                    opts: &opts,
                },
            );
        } else {
            let _ = delete(st, &t, &DeleteOptions::default(), &opts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(rv: &str, time: &str, manager: &str, spec: Value) -> Value {
        json!({
            "apiVersion": "netwave.dev/v1alpha1", "kind": "X",
            "metadata": {"name": "a", "resourceVersion": rv, "managedFields": [
                {"manager": manager, "operation": "Apply", "time": time, "fieldsV1": {"f:spec": {}}}
            ]},
            "spec": spec,
            "status": {"phase": "Provisioned"},
        })
    }

    #[test]
    fn a_write_is_a_no_op_only_when_nothing_but_its_bookkeeping_changed() {
        let old = obj("7", "t1", "m", json!({"x": 1}));
        assert!(same_ignoring_bookkeeping(
            &old,
            &obj("", "t2", "m", json!({"x": 1}))
        ));
        assert!(
            !same_ignoring_bookkeeping(&old, &obj("7", "t1", "other", json!({"x": 1}))),
            "a change of ownership alone is a real write"
        );
        assert!(!same_ignoring_bookkeeping(
            &old,
            &obj("7", "t1", "m", json!({"x": 2}))
        ));
        let mut labelled = old.clone();
        labelled["metadata"]["labels"] = json!({"k": "v"});
        assert!(!same_ignoring_bookkeeping(&old, &labelled));
        let mut status = old.clone();
        status["status"]["phase"] = json!("Invalid");
        assert!(!same_ignoring_bookkeeping(&old, &status));
    }

    #[test]
    fn the_generation_compares_everything_but_metadata_and_status() {
        let old = obj("7", "t1", "m", json!({"x": 1}));
        assert!(same_but_meta_status(
            &old,
            &obj("8", "t2", "other", json!({"x": 1}))
        ));
        let mut status = old.clone();
        status["status"]["phase"] = json!("Invalid");
        assert!(same_but_meta_status(&old, &status));
        assert!(!same_but_meta_status(
            &old,
            &obj("7", "t1", "m", json!({"x": 2}))
        ));
        let mut extra = old.clone();
        extra["data"] = json!(1);
        assert!(!same_but_meta_status(&old, &extra), "a new top-level field");
        assert!(
            !same_but_meta_status(&extra, &old),
            "a removed top-level field"
        );
    }
}
