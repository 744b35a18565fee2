//! Parquet footer checks. Every file lakecdc writes or reads must carry the system columns with
//! exactly the physical and logical types DuckDB reports as `row_id UUID`, `changed_at`,
//! `deleted_at` and `ltbase_created_at BIGINT` (docs/hazards.md #187/#189): a file missing one would be
//! NULL-padded by `union_by_name` and silently misfold rows.

use std::fs::File;
use std::path::Path;

use parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use parquet::file::metadata::FileMetaData;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::Type;

use crate::error::{Error, Result};

/// The system columns checked in every file: (name, expected DuckDB type).
pub const REQUIRED: [(&str, &str); 4] = [
    ("row_id", "UUID"),
    ("changed_at", "BIGINT"),
    ("deleted_at", "BIGINT"),
    ("ltbase_created_at", "BIGINT"),
];

/// What the footer says about a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FooterInfo {
    /// Total rows over all row groups.
    pub row_count: i64,
    /// Top-level column names in file order, with their DuckDB-style type where known.
    pub columns: Vec<(String, String)>,
}

/// Reads a local Parquet file's footer and checks the system columns.
pub fn check_file(path: &Path) -> Result<FooterInfo> {
    let name = path.display().to_string();
    let file = File::open(path).map_err(|source| Error::Io {
        op: "open parquet file",
        path: path.to_path_buf(),
        source,
    })?;
    let reader = SerializedFileReader::new(file).map_err(|e| Error::Parquet {
        path: name.clone(),
        message: format!("unreadable footer: {e}"),
    })?;
    check_metadata(&name, reader.metadata().file_metadata())
}

/// The smallest and largest `row_id` a local Parquet file holds, read from the column itself
/// (its statistics are a writer's claim); `None` for a file of no rows. A manifest's range
/// is what point lookups prune by, so `verify` holds it to this (docs/hazards.md R14).
pub fn row_id_range(path: &Path) -> Result<Option<(uuid::Uuid, uuid::Uuid)>> {
    use arrow::array::{Array, FixedSizeBinaryArray};
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let name = path.display().to_string();
    let bad = |message: String| Error::Parquet {
        path: name.clone(),
        message,
    };
    let file = File::open(path).map_err(|source| Error::Io {
        op: "open parquet file",
        path: path.to_path_buf(),
        source,
    })?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| bad(format!("unreadable footer: {e}")))?;
    let leaf = builder
        .parquet_schema()
        .columns()
        .iter()
        .position(|c| c.path().parts() == ["row_id"])
        .ok_or_else(|| bad("no row_id column".into()))?;
    let mask = ProjectionMask::leaves(builder.parquet_schema(), [leaf]);
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(|e| bad(format!("read row_id: {e}")))?;
    let mut range: Option<(uuid::Uuid, uuid::Uuid)> = None;
    for batch in reader {
        let batch = batch.map_err(|e| bad(format!("read row_id: {e}")))?;
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<FixedSizeBinaryArray>()
            .filter(|a| a.value_length() == 16)
            .ok_or_else(|| bad("row_id is not 16-byte values".into()))?;
        for i in 0..ids.len() {
            if ids.is_null(i) {
                return Err(bad("a NULL row_id".into()));
            }
            let id =
                uuid::Uuid::from_slice(ids.value(i)).map_err(|e| bad(format!("row_id: {e}")))?;
            range = Some(match range {
                None => (id, id),
                Some((lo, hi)) => (lo.min(id), hi.max(id)),
            });
        }
    }
    Ok(range)
}

/// Checks the system columns of a file's parsed footer (`name` for messages).
pub fn check_metadata(name: &str, meta: &FileMetaData) -> Result<FooterInfo> {
    let root = meta.schema_descr().root_schema();
    let columns: Vec<(String, String)> = root
        .get_fields()
        .iter()
        .map(|f| (f.name().to_string(), duckdb_type(f)))
        .collect();
    for (col, want) in REQUIRED {
        match columns.iter().find(|(n, _)| n == col) {
            None => {
                return Err(Error::Parquet {
                    path: name.to_string(),
                    message: format!("system column {col} is missing"),
                });
            }
            Some((_, have)) if have != want => {
                return Err(Error::Parquet {
                    path: name.to_string(),
                    message: format!("system column {col} is {have}, expected {want}"),
                });
            }
            Some(_) => {}
        }
    }
    Ok(FooterInfo {
        row_count: meta.num_rows(),
        columns,
    })
}

/// The DuckDB type name a Parquet field reads as (the subset lakecdc writes; anything else is
/// described by its physical type so that a mismatch is visible).
pub fn duckdb_type(field: &Type) -> String {
    if field.is_group() {
        return match field.get_fields() {
            [list] if list.is_group() => match list.get_fields() {
                [item] => format!("{}[]", duckdb_type(item)),
                _ => "STRUCT".to_string(),
            },
            _ => "STRUCT".to_string(),
        };
    }
    let info = field.get_basic_info();
    // Older writers set only the converted type; map it to the equivalent logical type.
    let converted = match info.converted_type() {
        ConvertedType::INT_16 => Some(LogicalType::Integer {
            bit_width: 16,
            is_signed: true,
        }),
        ConvertedType::INT_32 => Some(LogicalType::Integer {
            bit_width: 32,
            is_signed: true,
        }),
        ConvertedType::INT_64 => Some(LogicalType::Integer {
            bit_width: 64,
            is_signed: true,
        }),
        ConvertedType::UTF8 => Some(LogicalType::String),
        _ => None,
    };
    let logical = info.logical_type_ref().cloned().or(converted);
    match (field.get_physical_type(), logical.as_ref()) {
        (PhysicalType::FIXED_LEN_BYTE_ARRAY, Some(LogicalType::Uuid)) => "UUID".into(),
        (PhysicalType::INT64, None) => "BIGINT".into(),
        (
            PhysicalType::INT64,
            Some(LogicalType::Integer {
                bit_width: 64,
                is_signed: true,
            }),
        ) => "BIGINT".into(),
        (
            PhysicalType::INT32,
            Some(LogicalType::Integer {
                bit_width: 16,
                is_signed: true,
            }),
        ) => "SMALLINT".into(),
        (PhysicalType::INT32, None) => "INTEGER".into(),
        (
            PhysicalType::INT32,
            Some(LogicalType::Integer {
                bit_width: 32,
                is_signed: true,
            }),
        ) => "INTEGER".into(),
        (PhysicalType::DOUBLE, _) => "DOUBLE".into(),
        (PhysicalType::BOOLEAN, _) => "BOOLEAN".into(),
        (PhysicalType::BYTE_ARRAY, Some(LogicalType::String)) => "VARCHAR".into(),
        (PhysicalType::BYTE_ARRAY, None) => "BLOB".into(),
        (physical, _) => format!("{physical}"),
    }
}
