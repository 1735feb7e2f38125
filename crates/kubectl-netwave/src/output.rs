//! `-o json|yaml`: the same view a command prints as text, serialized.

use std::io::Write;

use serde::Serialize;

use crate::cli::Output;

/// Writes `view` as JSON or YAML; `text` renders it for people.
pub fn emit<T: Serialize>(
    out: &mut (dyn Write + Send),
    format: Output,
    view: &T,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    match format {
        Output::Text => out.write_all(text(view).as_bytes())?,
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, view)?;
            out.write_all(b"\n")?;
        }
        Output::Yaml => out.write_all(serde_saphyr::to_string(view)?.as_bytes())?,
    }
    out.flush()?;
    Ok(())
}

/// `a, b, c and 7 more`.
pub fn names(first: &[String], total: usize) -> String {
    let mut s = first.join(", ");
    if total > first.len() {
        s.push_str(&format!(" and {} more", total - first.len()));
    }
    s
}

/// For `skip_serializing_if`: a count of nothing is left out of the JSON.
pub fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}
