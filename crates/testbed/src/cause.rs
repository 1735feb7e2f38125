//! A field-level problem (a `causes[]` entry of a `Status`): what schema validation and the verbs
//! report, and the status module renders. A leaf of its own, so schema validation does not use the status
//! module (which uses the resources, which use the schema).

/// One field-level problem (a `causes[]` entry of a `Status`).
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldManagerConflict`, ...
    pub reason: String,
    pub message: String,
    /// Field path such as `spec.vni` or `.spec.holderIdentity`.
    pub field: String,
}
