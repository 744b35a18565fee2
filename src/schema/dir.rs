//! The schema directory: `<name>.json` (a JSON schema, used for registration) and
//! `<name>_attributes.json` (attribute metadata) per schema. Loading validates the metadata
//! completely — types, the binding matrix (docs/design.md §2.3), duplicate ids and columns, fold
//! collisions and reserved names — and every error names the file and the attribute.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::columns::{fold, is_reserved};
use super::{Attribute, ColumnBinding, Encoding, SchemaDef, SlotType, ValueType, slot_type};
use crate::config::check_schema_name;
use crate::error::{Error, Result};

const ATTRIBUTES_SUFFIX: &str = "_attributes.json";

/// The path of a schema's attribute metadata file.
pub fn attributes_path(dir: &Path, schema: &str) -> PathBuf {
    dir.join(format!("{schema}{ATTRIBUTES_SUFFIX}"))
}

/// The schema names defined in `dir` (every `<name>.json` that is not an attributes file),
/// sorted by file name. Each must have a readable JSON object and an attributes file.
pub fn scan(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        op: "read schema directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io {
            op: "read schema directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.ends_with(ATTRIBUTES_SUFFIX) {
            continue;
        }
        if let Some(name) = file.strip_suffix(".json") {
            // The stem is registered as the schema's name, which jobs join back to `dir`.
            check_schema_name(name).map_err(|e| Error::Metadata {
                path: entry.path(),
                message: format!(
                    "{e} (a file's name less .json is its schema's name); rename the file"
                ),
            })?;
            names.push(name.to_string());
        }
    }
    names.sort();
    for name in &names {
        let path = dir.join(format!("{name}.json"));
        let value: serde_json::Value = read_json(&path)?;
        if !value.is_object() {
            return Err(Error::Metadata {
                path,
                message: "must be a JSON object (a JSON schema)".to_string(),
            });
        }
        if !attributes_path(dir, name).exists() {
            return Err(Error::Metadata {
                path: attributes_path(dir, name),
                message: format!("missing: schema {name:?} needs its attribute metadata file"),
            });
        }
    }
    Ok(names)
}

/// Loads and validates one schema's attribute metadata. A missing or empty file is an error
/// (docs/hazards.md #193): an export without metadata would be unreadable.
pub fn load(dir: &Path, schema: &str) -> Result<SchemaDef> {
    // A name that is not a plain file name would reach outside `dir` (docs/hazards.md S6).
    check_schema_name(schema).map_err(|e| Error::Metadata {
        path: dir.to_path_buf(),
        message: format!("{e}; no metadata is read for it"),
    })?;
    let path = attributes_path(dir, schema);
    if !path.exists() {
        return Err(Error::Metadata {
            path,
            message: format!(
                "attribute metadata for schema {schema:?} not found: add the file or fix --schema-dir"
            ),
        });
    }
    let raw: BTreeMap<String, RawAttribute> = read_json(&path)?;
    parse(&path, schema, raw)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        op: "read schema metadata",
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Metadata {
        path: path.to_path_buf(),
        message: format!("invalid JSON: {e}"),
    })
}

#[derive(Debug, Deserialize)]
struct RawAttribute {
    #[serde(rename = "attributeID")]
    attribute_id: Option<serde_json::Value>,
    #[serde(rename = "valueType")]
    value_type: Option<String>,
    #[serde(default, alias = "itemsType")]
    items_type: Option<String>,
    #[serde(default)]
    column_binding: Option<RawBinding>,
}

#[derive(Debug, Deserialize)]
struct RawBinding {
    col_name: Option<String>,
    #[serde(default)]
    encoding: Option<String>,
}

/// Validates raw metadata into a [`SchemaDef`].
fn parse(path: &Path, schema: &str, raw: BTreeMap<String, RawAttribute>) -> Result<SchemaDef> {
    let err = |attr: &str, message: String| Error::Metadata {
        path: path.to_path_buf(),
        message: format!("attribute {attr:?}: {message}"),
    };
    if raw.is_empty() {
        return Err(Error::Metadata {
            path: path.to_path_buf(),
            message: format!("schema {schema:?} has no attributes"),
        });
    }
    let mut attributes = Vec::with_capacity(raw.len());
    for (name, r) in raw {
        let id = r
            .attribute_id
            .as_ref()
            .and_then(serde_json::Value::as_i64)
            .and_then(|v| i16::try_from(v).ok())
            .filter(|v| *v > 0)
            .ok_or_else(|| err(&name, "attributeID must be an integer in 1..=32767".into()))?;
        let vt_text = r
            .value_type
            .as_deref()
            .ok_or_else(|| err(&name, "valueType is missing".into()))?;
        let value_type = ValueType::parse(vt_text).ok_or_else(|| {
            err(
                &name,
                format!(
                    "unknown valueType {vt_text:?}; expected one of {}",
                    type_list()
                ),
            )
        })?;
        let items_type = match (&r.items_type, value_type) {
            (None, ValueType::List) => Some(ValueType::Text),
            (None, _) => None,
            (Some(t), ValueType::List) => match ValueType::parse(t) {
                Some(ValueType::List) | None => {
                    return Err(err(
                        &name,
                        format!("items_type {t:?} must be a scalar value type"),
                    ));
                }
                some => some,
            },
            (Some(_), _) => return Err(err(&name, "items_type is only valid for a list".into())),
        };
        let binding = match r.column_binding {
            None => None,
            Some(b) => Some(parse_binding(value_type, b).map_err(|m| err(&name, m))?),
        };
        attributes.push(Attribute {
            column: fold(&name),
            name,
            id,
            value_type,
            items_type,
            binding,
        });
    }
    check_unique(&attributes).map_err(|(attr, m)| err(&attr, m))?;
    Ok(SchemaDef {
        name: schema.to_string(),
        attributes,
    })
}

fn type_list() -> String {
    ValueType::ALL
        .iter()
        .map(|t| t.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Applies the binding matrix (docs/design.md §2.3).
fn parse_binding(vt: ValueType, b: RawBinding) -> Result<ColumnBinding, String> {
    let column = b
        .col_name
        .filter(|c| !c.is_empty())
        .ok_or("column_binding.col_name is missing")?;
    let slot = slot_type(&column).ok_or_else(|| {
        format!("column_binding.col_name {column:?} is not an entity_main slot column (text_01..text_10, smallint_01..03, integer_01..03, bigint_01..03, double_01..03, uuid_01..02)")
    })?;
    let enc_text = b.encoding.unwrap_or_default();
    let encoding = Encoding::parse(&enc_text).ok_or_else(|| {
        format!("unknown encoding {enc_text:?}; expected default, unix_ms, iso8601, bool_smallint or bool_text")
    })?;
    use {Encoding as E, SlotType as S, ValueType as V};
    let allowed = match vt {
        V::Text => slot == S::Text && encoding == E::Default,
        V::Uuid => slot == S::Uuid && encoding == E::Default,
        V::Smallint | V::Integer | V::Bigint | V::Numeric => {
            matches!(slot, S::Smallint | S::Integer | S::Bigint | S::Double)
                && encoding == E::Default
        }
        V::Date | V::Datetime => {
            (slot == S::Bigint && matches!(encoding, E::Default | E::UnixMs))
                || (slot == S::Text && encoding == E::Iso8601)
        }
        V::Bool => {
            (slot == S::Smallint && encoding == E::BoolSmallint)
                || (slot == S::Text && encoding == E::BoolText)
        }
        V::List => {
            return Err("a list cannot be bound to a column (it is stored in eav_data)".into());
        }
    };
    if !allowed {
        return Err(format!(
            "a {vt} attribute cannot be bound to {column} ({}) with encoding {}",
            slot.sql(),
            encoding.as_str()
        ));
    }
    Ok(ColumnBinding {
        column,
        slot,
        encoding,
    })
}

/// Refuses duplicate ids, two attributes on one slot column, reserved columns, and two
/// attributes folding onto one column (ASCII case-insensitive).
fn check_unique(attrs: &[Attribute]) -> Result<(), (String, String)> {
    let mut ids: HashMap<i16, &str> = HashMap::new();
    let mut slots: HashMap<&str, &str> = HashMap::new();
    let mut columns: HashMap<String, &str> = HashMap::new();
    for a in attrs {
        if let Some(other) = ids.insert(a.id, &a.name) {
            return Err((
                a.name.clone(),
                format!("attributeID {} is also used by {other:?}", a.id),
            ));
        }
        if let Some(b) = &a.binding
            && let Some(other) = slots.insert(&b.column, &a.name)
        {
            return Err((
                a.name.clone(),
                format!("column {} is also bound by {other:?}", b.column),
            ));
        }
        if is_reserved(&a.column) {
            return Err((
                a.name.clone(),
                format!(
                    "its column name {:?} is reserved; rename the attribute",
                    a.column
                ),
            ));
        }
        if let Some(other) = columns.insert(a.column.to_ascii_lowercase(), &a.name) {
            return Err((
                a.name.clone(),
                format!(
                    "its column name {:?} collides with attribute {other:?} (names are compared case-insensitively after folding); rename one of them",
                    a.column
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(json: &str) -> Result<SchemaDef> {
        let raw: BTreeMap<String, RawAttribute> = serde_json::from_str(json).unwrap();
        parse(Path::new("x_attributes.json"), "x", raw)
    }

    fn err_of(json: &str) -> String {
        load_str(json).unwrap_err().to_string()
    }

    #[test]
    fn names_that_are_not_plain_file_names_read_nothing_outside_the_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("schemas");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        // Metadata files planted where each name would lead: reading one would be a JSON
        // error (or a load), not the name error.
        for planted in [
            "evil_attributes.json",
            "sub/x_attributes.json",
            "abs_attributes.json",
        ] {
            let p = if planted.starts_with("sub/") {
                dir.join(planted)
            } else {
                root.path().join(planted)
            };
            std::fs::write(p, "planted").unwrap();
        }
        let abs = root.path().join("abs").display().to_string();
        for name in ["../evil", "sub/x", abs.as_str(), "..", "x\u{1b}[2J"] {
            let e = load(&dir, name).unwrap_err();
            let text = e.to_string();
            assert!(
                matches!(&e, Error::Metadata { path, .. } if path == &dir),
                "{e:?}"
            );
            assert!(text.contains("is not a valid schema name"), "{text}");
            assert!(
                !text.contains("JSON") && !text.contains("planted"),
                "{text}"
            );
            assert!(!text.chars().any(char::is_control), "{text:?}");
        }
    }

    #[test]
    fn a_metadata_file_whose_name_is_not_a_schema_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["bad name.json", "bad name_attributes.json"] {
            std::fs::write(dir.path().join(f), "{}").unwrap();
        }
        let e = scan(dir.path()).unwrap_err();
        assert!(
            matches!(&e, Error::Metadata { path, .. } if path.ends_with("bad name.json")),
            "{e:?}"
        );
        assert!(e.to_string().contains("rename the file"), "{e}");
    }

    #[test]
    fn accepts_every_kind_and_folds_names() {
        let s = load_str(
            r#"{
            "contact.email": {"attributeID": 1, "valueType": "text", "column_binding": {"col_name": "text_01"}},
            "score": {"attributeID": 2, "valueType": "integer"},
            "tags": {"attributeID": 3, "valueType": "list", "items_type": "integer"},
            "born": {"attributeID": 4, "valueType": "date", "column_binding": {"col_name": "text_02", "encoding": "iso8601"}},
            "active": {"attributeID": 5, "valueType": "bool", "column_binding": {"col_name": "smallint_01", "encoding": "bool_smallint"}},
            "notes": {"attributeID": 6, "valueType": "list"}
        }"#,
        )
        .unwrap();
        let cols = s.export_columns();
        let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            &names[7..],
            ["active", "born", "contact_email", "notes", "score", "tags"]
        );
        let types: Vec<&str> = cols[7..].iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(
            types,
            [
                "BOOLEAN",
                "BIGINT",
                "VARCHAR",
                "VARCHAR[]",
                "DOUBLE",
                "DOUBLE[]"
            ]
        );
    }

    #[test]
    fn binding_matrix_is_enforced() {
        let e = err_of(
            r#"{"a": {"attributeID": 1, "valueType": "text", "column_binding": {"col_name": "bigint_01"}}}"#,
        );
        assert!(
            e.contains("\"a\"") && e.contains("cannot be bound to bigint_01"),
            "{e}"
        );
        let e = err_of(
            r#"{"l": {"attributeID": 1, "valueType": "list", "column_binding": {"col_name": "text_01"}}}"#,
        );
        assert!(
            e.contains("\"l\"") && e.contains("list cannot be bound"),
            "{e}"
        );
        let e = err_of(
            r#"{"b": {"attributeID": 1, "valueType": "bool", "column_binding": {"col_name": "smallint_01"}}}"#,
        );
        assert!(e.contains("cannot be bound"), "{e}");
        let e = err_of(
            r#"{"b": {"attributeID": 1, "valueType": "text", "column_binding": {"col_name": "text_11"}}}"#,
        );
        assert!(e.contains("not an entity_main slot column"), "{e}");
        let e = err_of(
            r#"{"d": {"attributeID": 1, "valueType": "datetime", "column_binding": {"col_name": "bigint_01", "encoding": "iso8601"}}}"#,
        );
        assert!(e.contains("cannot be bound"), "{e}");
    }

    #[test]
    fn fold_collisions_and_reserved_names_are_refused() {
        let e = err_of(
            r#"{"a.b": {"attributeID": 1, "valueType": "text"}, "A_B": {"attributeID": 2, "valueType": "text"}}"#,
        );
        assert!(e.contains("collides"), "{e}");
        assert!(e.contains("x_attributes.json"), "{e}");
        let e = err_of(r#"{"Changed_At": {"attributeID": 1, "valueType": "text"}}"#);
        assert!(
            e.contains("\"Changed_At\"") && e.contains("reserved"),
            "{e}"
        );
        let e = err_of(r#"{"row.id": {"attributeID": 1, "valueType": "text"}}"#);
        assert!(e.contains("reserved"), "{e}");
    }

    #[test]
    fn ids_types_and_duplicates_are_checked() {
        assert!(err_of(r#"{"a": {"valueType": "text"}}"#).contains("attributeID"));
        assert!(
            err_of(r#"{"a": {"attributeID": 0, "valueType": "text"}}"#).contains("attributeID")
        );
        assert!(
            err_of(r#"{"a": {"attributeID": 40000, "valueType": "text"}}"#).contains("attributeID")
        );
        assert!(
            err_of(r#"{"a": {"attributeID": 1, "valueType": "txt"}}"#)
                .contains("unknown valueType \"txt\"")
        );
        assert!(err_of(r#"{"a": {"attributeID": 1}}"#).contains("valueType is missing"));
        assert!(err_of(r#"{"a": {"attributeID": 1, "valueType": "text"}, "b": {"attributeID": 1, "valueType": "text"}}"#).contains("also used by"));
        assert!(err_of(r#"{"a": {"attributeID": 1, "valueType": "text", "column_binding": {"col_name": "text_01"}}, "b": {"attributeID": 2, "valueType": "text", "column_binding": {"col_name": "text_01"}}}"#).contains("also bound by"));
        assert!(
            err_of(r#"{"a": {"attributeID": 1, "valueType": "list", "items_type": "list"}}"#)
                .contains("scalar")
        );
        assert!(err_of(r#"{}"#).contains("no attributes"));
    }
}
