//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`) and field selectors.

use serde_json::Value;

use crate::store::Object;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn set_values(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("found '{rest}', expected: '('"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for term in split_top(s) {
            if let Some(k) = term.strip_prefix('!') {
                reqs.push(Req::NotExists(k.trim().to_string()));
            } else if let Some((k, v)) = term.split_once("!=") {
                reqs.push(Req::NotEq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = term.split_once("==") {
                reqs.push(Req::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = term.split_once('=') {
                reqs.push(Req::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, rest)) = term.split_once(" notin ") {
                reqs.push(Req::NotIn(k.trim().into(), set_values(rest)?));
            } else if let Some((k, rest)) = term.split_once(" in ") {
                reqs.push(Req::In(k.trim().into(), set_values(rest)?));
            } else if term.contains(' ') || term.contains('(') {
                return Err(format!("unable to parse requirement: {term}"));
            } else {
                reqs.push(Req::Exists(term));
            }
        }
        Ok(LabelSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        self.matches_with(|k| labels.get(k).and_then(|v| v.as_str()))
    }

    /// Matches against a label lookup.
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `path=value` / `path!=value` terms on dotted paths.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(Vec<String>, bool, String)>);

impl FieldSelector {
    /// Parses and checks the fields against `allowed` (None: any dotted path).
    pub fn parse(s: &str, allowed: Option<&[&str]>) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (k, eq, v) = if let Some((k, v)) = term.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let k = k.trim();
            if let Some(allowed) = allowed
                && !allowed.contains(&k)
            {
                return Err(format!("field label not supported: {k}"));
            }
            terms.push((
                k.split('.').map(String::from).collect(),
                eq,
                v.trim().to_string(),
            ));
        }
        Ok(FieldSelector(terms))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name when the selector is exactly `metadata.name=<name>` (lets lists skip a scan).
    pub fn single_name(&self) -> Option<&str> {
        match self.0.as_slice() {
            [(path, true, v)] if path.len() == 2 && path[0] == "metadata" && path[1] == "name" => {
                Some(v)
            }
            _ => None,
        }
    }

    /// Matches a stored object, parsing it only for fields beyond name and namespace.
    pub fn matches_object(&self, o: &Object) -> bool {
        let simple = self.0.iter().all(|(p, _, _)| {
            p.len() == 2 && p[0] == "metadata" && (p[1] == "name" || p[1] == "namespace")
        });
        if !simple {
            return self.matches(&o.value());
        }
        self.0.iter().all(|(p, eq, want)| {
            let got = if p[1] == "name" {
                o.name.as_str()
            } else {
                o.namespace.as_deref().unwrap_or_default()
            };
            (got == want) == *eq
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let mut cur = obj;
            for p in path {
                cur = &cur[p.as_str()];
            }
            let got = match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (got == *want) == *eq
        })
    }
}

/// Both selectors of a list or watch.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    pub fn matches_object(&self, o: &Object) -> bool {
        self.labels.matches_with(|k| o.label(k)) && self.fields.matches_object(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_operators() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "fe"}}});
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "tier in (fe, be)",
            "tier notin (be)",
            "app",
            "!missing",
            "app=web,tier",
        ];
        let no = [
            "app=db",
            "app!=web",
            "tier in (be)",
            "tier notin (fe,be)",
            "missing",
            "!app",
            "app=web,missing",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        assert!(LabelSelector::parse("x in a").is_err());
    }

    #[test]
    fn field_selector() {
        let o = json!({"metadata": {"name": "n1", "namespace": "default"}});
        let f = FieldSelector::parse("metadata.name=n1", Some(&["metadata.name"])).unwrap();
        assert!(f.matches(&o));
        assert_eq!(f.single_name(), Some("n1"));
        assert!(
            !FieldSelector::parse("metadata.name!=n1", None)
                .unwrap()
                .matches(&o)
        );
        assert!(FieldSelector::parse("spec.x=1", Some(&["metadata.name"])).is_err());
    }
}
