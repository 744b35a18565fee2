//! Pieces shared by the jobs' run reports.

use serde::Serialize;

/// One file a job wrote (or, in a dry run, would write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileReport {
    /// The object key (empty for a planned file).
    pub path: String,
    /// Rows in the file.
    pub rows: u64,
    /// Bytes stored.
    pub bytes: u64,
}

/// The JSON spelling of a unit enum (outcome, decision), for the human-readable tables.
pub(crate) fn label<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
