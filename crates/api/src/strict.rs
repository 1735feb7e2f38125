//! Strict decoding, as `kubectl apply`'s strict field validation does it: a field the type does not
//! have is an error naming its path (a misspelt field must not vanish silently).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Deserializes `doc` and rejects fields the type does not have.
pub fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let object: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    if let Some(path) = unknown_field(doc, &back, String::new()) {
        return Err(format!("unknown field {path}"));
    }
    Ok(object)
}

/// The first field path present (and not null) in `input` but absent from `known`.
fn unknown_field(input: &Value, known: &Value, path: String) -> Option<String> {
    match (input, known) {
        (Value::Object(i), Value::Object(k)) => i.iter().find_map(|(key, value)| {
            let p = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            match k.get(key) {
                None if !value.is_null() => Some(p),
                None => None,
                Some(kv) => unknown_field(value, kv, p),
            }
        }),
        (Value::Array(i), Value::Array(k)) => i
            .iter()
            .zip(k)
            .enumerate()
            .find_map(|(n, (iv, kv))| unknown_field(iv, kv, format!("{path}[{n}]"))),
        _ => None,
    }
}
