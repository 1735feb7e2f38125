//! The kinds the server knows: built-ins and those registered by CustomResourceDefinitions.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::schema::{self, Schema};
use crate::ssa::ListTypes;

/// An additional printer column of a CRD version (or a built-in).
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// One served resource (group + plural), with what the server needs to serve it.
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    /// Served versions, storage version first.
    pub versions: Vec<String>,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    /// Has a `/status` subresource (main endpoint ignores status).
    pub status: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Custom resource: 415 on strategic merge, generation, unconditional update refused.
    pub custom: bool,
    /// `metadata.generation` is maintained.
    pub generation: bool,
    /// Structural schema per version (custom resources).
    pub schemas: BTreeMap<String, Arc<Schema>>,
    /// Printer columns per version (empty: Name and Age).
    pub columns: BTreeMap<String, Vec<Column>>,
    /// Associative lists for server-side apply.
    pub lists: ListTypes,
}

impl ResourceType {
    /// `group/plural`, the storage key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    /// Where objects are kept: events.k8s.io/v1 Events share core/v1's storage.
    pub fn storage_key(&self) -> String {
        if self.is_events_v1() {
            "/events".into()
        } else {
            self.key()
        }
    }

    pub fn is_events_v1(&self) -> bool {
        self.group == "events.k8s.io" && self.plural == "events"
    }

    /// `plural` or `plural.group` as in error messages.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub fn is_crd(&self) -> bool {
        self.group == "apiextensions.k8s.io" && self.plural == "customresourcedefinitions"
    }

    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.plural == "namespaces"
    }

    /// The `APIResource` discovery entries (resource and its status subresource).
    pub fn discovery(&self) -> Vec<Value> {
        let mut verbs = vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ];
        verbs.sort();
        let mut r = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        });
        if !self.short_names.is_empty() {
            r["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            r["categories"] = json!(self.categories);
        }
        let mut out = vec![r];
        if self.status {
            out.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        out
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    status: bool,
    short: &[&str],
    generation: bool,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        versions: vec![version.into()],
        kind: kind.into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        namespaced,
        status,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: Vec::new(),
        custom: false,
        generation,
        schemas: BTreeMap::new(),
        columns: BTreeMap::new(),
        lists: ListTypes::default(),
    }
}

/// The built-in kinds: core/v1 Node, Namespace, Event, ConfigMap; events.k8s.io/v1 Event;
/// coordination.k8s.io/v1 Lease; apiextensions.k8s.io/v1 CustomResourceDefinition.
pub fn builtins() -> Vec<ResourceType> {
    let mut node = builtin("", "v1", "Node", "nodes", false, true, &["no"], false);
    let by_type = |field: &str| {
        (
            vec!["status".to_string(), field.to_string()],
            vec!["type".to_string()],
        )
    };
    node.lists = ListTypes(vec![by_type("conditions"), by_type("addresses")]);
    vec![
        node,
        builtin(
            "",
            "v1",
            "Namespace",
            "namespaces",
            false,
            true,
            &["ns"],
            false,
        ),
        builtin("", "v1", "Event", "events", true, false, &["ev"], false),
        builtin(
            "",
            "v1",
            "ConfigMap",
            "configmaps",
            true,
            false,
            &["cm"],
            false,
        ),
        builtin(
            "events.k8s.io",
            "v1",
            "Event",
            "events",
            true,
            false,
            &["ev"],
            false,
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "Lease",
            "leases",
            true,
            false,
            &[],
            false,
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
            true,
            &["crd", "crds"],
            true,
        ),
    ]
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Reads a CustomResourceDefinition object into the resource it defines. Errors name the field.
pub fn from_crd(crd: &Value) -> Result<ResourceType, (String, String)> {
    let spec = &crd["spec"];
    let group = spec["group"]
        .as_str()
        .ok_or(("spec.group".into(), "Required value".into()))?;
    let names = &spec["names"];
    let plural = names["plural"]
        .as_str()
        .ok_or(("spec.names.plural".into(), "Required value".into()))?;
    let kind = names["kind"]
        .as_str()
        .ok_or(("spec.names.kind".into(), "Required value".into()))?;
    let expected = format!("{plural}.{group}");
    if crd["metadata"]["name"].as_str() != Some(expected.as_str()) {
        return Err((
            "metadata.name".into(),
            format!(
                "Invalid value: {}: must be spec.names.plural+\".\"+spec.group",
                crd["metadata"]["name"]
            ),
        ));
    }
    let scope = spec["scope"].as_str().unwrap_or("Namespaced");
    let mut versions = Vec::new();
    let mut schemas = BTreeMap::new();
    let mut columns = BTreeMap::new();
    let mut status = false;
    let mut lists = ListTypes::default();
    let empty = Vec::new();
    let vs = spec["versions"].as_array().unwrap_or(&empty);
    if vs.is_empty() {
        return Err((
            "spec.versions".into(),
            "Invalid value: []: must have exactly one version marked as storage version".into(),
        ));
    }
    for (i, v) in vs.iter().enumerate() {
        let name = v["name"]
            .as_str()
            .ok_or((format!("spec.versions[{i}].name"), "Required value".into()))?;
        if v["served"].as_bool() == Some(false) {
            continue;
        }
        if v["storage"].as_bool() == Some(true) {
            versions.insert(0, name.to_string());
        } else {
            versions.push(name.to_string());
        }
        if v["subresources"]["status"].is_object() {
            status = true;
        }
        if let Some(s) = v["schema"].get("openAPIV3Schema") {
            if v["storage"].as_bool() == Some(true) || lists.0.is_empty() {
                lists = ListTypes::from_schema(s);
            }
            let compiled = schema::compile(s).map_err(|e| {
                (
                    format!("spec.versions[{i}].schema.openAPIV3Schema{}", e.0),
                    e.1,
                )
            })?;
            schemas.insert(name.to_string(), Arc::new(compiled));
        }
        let cols = v["additionalPrinterColumns"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| Column {
                        name: c["name"].as_str().unwrap_or_default().to_string(),
                        type_: c["type"].as_str().unwrap_or("string").to_string(),
                        format: c["format"].as_str().unwrap_or_default().to_string(),
                        description: c["description"].as_str().unwrap_or_default().to_string(),
                        priority: c["priority"].as_i64().unwrap_or(0),
                        json_path: c["jsonPath"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        columns.insert(name.to_string(), cols);
    }
    Ok(ResourceType {
        group: group.into(),
        versions,
        kind: kind.into(),
        plural: plural.into(),
        singular: names["singular"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| kind.to_lowercase()),
        namespaced: scope == "Namespaced",
        status,
        short_names: strs(&names["shortNames"]),
        categories: strs(&names["categories"]),
        custom: true,
        generation: true,
        schemas,
        columns,
        lists,
    })
}

/// All served resources, by `group/plural`.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    types: BTreeMap<String, Arc<ResourceType>>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let mut r = Registry::default();
        for t in builtins() {
            r.register(t);
        }
        r
    }

    pub fn register(&mut self, t: ResourceType) {
        self.types.insert(t.key(), Arc::new(t));
    }

    pub fn unregister(&mut self, key: &str) {
        self.types.remove(key);
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .get(&format!("{group}/{plural}"))
            .filter(|t| t.versions.iter().any(|v| v == version))
            .cloned()
    }

    pub fn get(&self, key: &str) -> Option<Arc<ResourceType>> {
        self.types.get(key).cloned()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types.values()
    }

    /// Groups and their versions (`""` is the core group).
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut g: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.types.values() {
            let e = g.entry(t.group.clone()).or_default();
            for v in &t.versions {
                if !e.contains(v) {
                    e.push(v.clone());
                }
            }
        }
        g
    }
}
