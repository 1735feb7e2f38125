//! `Status` bodies: the errors the API answers with, shaped like kube-apiserver's.

use serde_json::{Value, json};

pub use crate::cause::Cause;
use crate::resources::ResourceType;

/// An API error answered as a `Status` body with `code`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` (name, group, kind, causes), when the real server sends them.
    pub details: Option<Value>,
}

fn details(rt: &ResourceType, name: &str, kind: &str) -> Value {
    let mut d = json!({ "name": name, "kind": kind });
    if !rt.group.is_empty() {
        d["group"] = json!(rt.group);
    }
    d
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        ApiError {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{name}\" not found", rt.group_resource()),
            details: Some(details(rt, name, &rt.plural)),
        }
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        ApiError {
            code: 404,
            reason: "NotFound",
            message: format!("namespaces \"{ns}\" not found"),
            details: Some(json!({ "name": ns, "kind": "namespaces" })),
        }
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        ApiError {
            code: 409,
            reason: "AlreadyExists",
            message: format!("{} \"{name}\" already exists", rt.group_resource()),
            details: Some(details(rt, name, &rt.plural)),
        }
    }

    /// 409 for a stale `resourceVersion` or a failed precondition.
    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        ApiError {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                rt.group_resource()
            ),
            details: Some(details(rt, name, &rt.plural)),
        }
    }

    pub fn stale(rt: &ResourceType, name: &str) -> Self {
        Self::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 of server-side apply: fields owned by other managers.
    pub fn apply_conflict(
        rt: &ResourceType,
        name: &str,
        conflicts: &[(String, String, String)],
    ) -> Self {
        // (manager, apiVersion, field)
        let n = conflicts.len();
        let message = if n == 1 {
            let (m, v, f) = &conflicts[0];
            format!("Apply failed with 1 conflict: conflict with \"{m}\" using {v}: {f}")
        } else {
            let mut s = format!("Apply failed with {n} conflicts: ");
            let mut lines = Vec::new();
            for (m, v, f) in conflicts {
                lines.push(format!("conflict with \"{m}\" using {v}: {f}"));
            }
            s.push_str(&lines.join("\n"));
            s
        };
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, v, f)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\" using {v}"), "field": f})
            })
            .collect();
        let mut d = details(rt, name, &rt.plural);
        d["causes"] = json!(causes);
        ApiError {
            code: 409,
            reason: "Conflict",
            message,
            details: Some(d),
        }
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub fn unsupported_media(accepted: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {accepted}"
            ),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 422 with one cause per field error, message `Kind.group "name" is invalid: ...`.
    pub fn invalid(rt: &ResourceType, name: &str, causes: Vec<Cause>) -> Self {
        let parts: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("[{}]", parts.join(", "))
        };
        let qualified = if rt.group.is_empty() {
            rt.kind.clone()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let mut d = details(rt, name, &rt.kind);
        d["causes"] = Value::Array(
            causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect(),
        );
        ApiError {
            code: 422,
            reason: "Invalid",
            message: format!("{qualified} \"{name}\" is invalid: {joined}"),
            details: Some(d),
        }
    }

    /// The JSON `Status` body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}
