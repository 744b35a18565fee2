//! Parquet column naming and typing (docs/design.md §3.1 and §3.1.2).
//!
//! The fold rule is byte-stable forever: files already written use it. Collisions and reserved
//! names are compared ASCII case-insensitively, as DuckDB compares identifiers.

use super::{Attribute, ValueType};

/// The system columns every lake file starts with, with their DuckDB types.
pub(crate) const SYSTEM_COLUMNS: [(&str, &str); 7] = [
    ("schema_id", "SMALLINT"),
    ("row_id", "UUID"),
    ("changed_at", "BIGINT"),
    ("deleted_at", "BIGINT"),
    ("ltbase_created_at", "BIGINT"),
    ("ltbase_updated_at", "BIGINT"),
    ("ltbase_deleted_at", "BIGINT"),
];

/// Names no attribute may fold onto.
pub(crate) const RESERVED: [&str; 18] = [
    "row_id",
    "schema_id",
    "changed_at",
    "deleted_at",
    "created_at",
    "ver_ts",
    "deleted_ts",
    "source_tier_priority",
    "rn",
    "attributes_json",
    "total_records",
    "total_pages",
    "current_page",
    "ltbase_row_id",
    "ltbase_schema_id",
    "ltbase_created_at",
    "ltbase_updated_at",
    "ltbase_deleted_at",
];

/// Folds an attribute name into its Parquet column name: backtick, `[` and `]` are dropped,
/// `.` and space become `_`; an empty result becomes `attr`.
pub(crate) fn fold(name: &str) -> String {
    let out: String = name
        .chars()
        .filter(|c| !matches!(c, '`' | '[' | ']'))
        .map(|c| if matches!(c, '.' | ' ') { '_' } else { c })
        .collect();
    if out.is_empty() {
        "attr".to_string()
    } else {
        out
    }
}

/// True when `column` equals a reserved or system name, ASCII case-insensitively.
pub(crate) fn is_reserved(column: &str) -> bool {
    RESERVED
        .iter()
        .chain(SYSTEM_COLUMNS.iter().map(|(n, _)| n))
        .any(|r| r.eq_ignore_ascii_case(column))
}

/// The DuckDB type of an attribute's column.
pub(crate) fn duckdb_type(attr: &Attribute) -> String {
    let bound = attr.binding.is_some();
    match attr.value_type {
        ValueType::List => format!(
            "{}[]",
            scalar_type(attr.items_type.unwrap_or(ValueType::Text), false)
        ),
        other => scalar_type(other, bound).to_string(),
    }
}

fn scalar_type(t: ValueType, bound: bool) -> &'static str {
    match t {
        ValueType::Text | ValueType::List => "VARCHAR",
        ValueType::Uuid => "UUID",
        ValueType::Smallint if bound => "SMALLINT",
        ValueType::Integer if bound => "INTEGER",
        ValueType::Smallint | ValueType::Integer | ValueType::Numeric => "DOUBLE",
        ValueType::Bigint | ValueType::Date | ValueType::Datetime => "BIGINT",
        ValueType::Bool => "BOOLEAN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_is_the_forma_rule() {
        assert_eq!(fold("contact.annualIncome"), "contact_annualIncome");
        assert_eq!(fold("`a b`[0]"), "a_b0");
        assert_eq!(fold("[]``"), "attr");
        assert_eq!(fold("plain"), "plain");
        assert_eq!(fold("é.x"), "é_x");
    }

    #[test]
    fn reserved_names_match_ascii_case_insensitively() {
        assert!(is_reserved("Row_ID"));
        assert!(is_reserved("LTBASE_CREATED_AT"));
        assert!(is_reserved("ver_ts"));
        assert!(!is_reserved("row_idx"));
        // Non-ASCII letters are not case-folded (DuckDB's rule).
        assert!(!is_reserved("row_İd"));
    }
}
