//! Lake Parquet files written from Arrow with the `parquet` crate. A file whose rows
//! [`super::assemble`] joined is made here: each column is its slot's (or raw EAV) value, or a
//! numeric cast of it done in Rust exactly as DuckDB's `TRY_CAST` does it; only the columns
//! that need DuckDB's own parsing (text read as a date or timestamp) are computed by DuckDB,
//! as Arrow, from the same rows. Text read as a UUID or a boolean word is read here, by
//! DuckDB's rules ([`uuid_from_text`], [`bool_from_text`]), and a list's items are converted
//! as scalar EAV values of the item type are. DuckDB's `COPY` took about
//! twice the CPU for the same file: it copies every value into its own vectors, buffers each
//! row group and analyses every column before encoding it.
//!
//! The file has the columns, types and values of [`super::export::assembled_sql`]
//! (docs/design.md §3.1): zstd level 3, V2 pages, 122,880-row groups, every column nullable, with the
//! encodings DuckDB picks for the lake's types — delta-packed integers, byte-stream-split
//! doubles, plain UUIDs, dictionary strings that fall back to delta lengths once the dictionary
//! outgrows [`DICTIONARY_PAGE_BYTES`].

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryBuilder, Int16Array};
use arrow::array::{Int64Array, ListArray, PrimitiveArray};
use arrow::compute::{CastOptions, cast_with_options, concat_batches};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Field, Float64Type, Int16Type, Int32Type, Int64Type, Schema,
};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use super::{Driver, ROW_GROUP_SIZE, ZSTD_LEVEL};
use crate::error::{Error, Result};
use crate::schema::batch::{change_log, entities, uuid_field};
use crate::schema::columns::{SYSTEM_COLUMNS, duckdb_type};
use crate::schema::{Attribute, Encoding as SlotEncoding, SchemaDef, ValueType};
use crate::scratch::Piecewise;

/// A string column's dictionary is given up for delta-length pages past this size: a column
/// of (nearly) unique values stops paying for hashing early, one of a few thousand values
/// keeps its dictionary.
pub(crate) const DICTIONARY_PAGE_BYTES: usize = 256 * 1024;

/// Test seam: a dictionary this small, so that a text column falls back to plain pages a
/// quarter page in, its pages then starting elsewhere than `row_id`'s (docs/design.md §9, runs).
const DICTIONARY_SEAM: &str = "LAKECDC_TEST_DICTIONARY_BYTES";

/// The Arrow type of a lake column of DuckDB type `name` ([`SYSTEM_COLUMNS`],
/// [`duckdb_type`]); a list `T[]` holds items named `element` of `T`'s type.
fn lake_type(name: &str) -> Option<DataType> {
    if let Some(item) = name.strip_suffix("[]") {
        let item = lake_type(item)?;
        return Some(DataType::List(Arc::new(lake_field("element", &item))));
    }
    Some(match name {
        "VARCHAR" => DataType::Utf8,
        "UUID" => DataType::FixedSizeBinary(16),
        "SMALLINT" => DataType::Int16,
        "INTEGER" => DataType::Int32,
        "BIGINT" => DataType::Int64,
        "DOUBLE" => DataType::Float64,
        "BOOLEAN" => DataType::Boolean,
        _ => return None,
    })
}

/// How an input column becomes a lake column.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Conv {
    /// Already the lake type.
    Same,
    /// `TRY_CAST` between integer widths (out of range → NULL) or integer → DOUBLE.
    Cast(DataType),
    /// `TRY_CAST(double AS BIGINT)`: rounded half to even; not finite or out of range → NULL.
    DoubleToBigint,
    /// `(x <> 0)` of a number.
    NonZero,
    /// `TRY_CAST(text AS UUID)`: see [`uuid_from_text`].
    UuidText,
    /// A boolean word (`SlotEncoding::BoolText`): see [`bool_from_text`].
    BoolText,
    /// A list whose items are converted as a scalar EAV value of the item type is (the
    /// pivot's `list_transform` of `export::eav_cast`).
    List(Box<Conv>),
}

/// How one lake column is made from an assembled row.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Make {
    /// The schema id, on every row.
    SchemaId(i16),
    /// A base's `deleted_at`: 0.
    Zero,
    /// A delta's `deleted_at`: the slot's when positive, else the version of a row without
    /// an entity row (a hard delete), else 0.
    DeltaDeleted,
    /// Input column `name`, converted.
    Column { name: String, conv: Conv },
    /// Column `i` of DuckDB's result.
    Duck(usize),
}

/// How each column of a lake file is made from assembled rows, and which of
/// [`super::export::assembled_sql`]'s expressions DuckDB computes.
#[derive(Debug)]
pub(crate) struct Plan {
    /// (column name, how it is made), in file order.
    columns: Vec<(String, Make)>,
    /// The expressions DuckDB computes, in the order of its result columns.
    duck: Vec<String>,
    /// Which of DuckDB's columns hold UUIDs (or lists of them), which it hands over as text.
    duck_uuids: Vec<bool>,
    /// The input column DuckDB also returns, last, to prove its rows are the input's rows in
    /// the input's order.
    check: &'static str,
}

impl Plan {
    /// The plan for `driver`'s file of `schema` from assembled rows of schema `input`;
    /// `columns` are [`super::export::assembled_sql`]'s (name, expression) pairs in file
    /// order, of which DuckDB computes the ones Rust cannot make exactly.
    pub(crate) fn new(
        schema: &SchemaDef,
        schema_id: i16,
        driver: Driver,
        input: &Schema,
        columns: &[(String, String)],
    ) -> Result<Self> {
        let (row_id, version) = match driver {
            Driver::Entities => (entities::ROW_ID, entities::UPDATED_AT),
            Driver::ChangeLog => (change_log::ROW_ID, change_log::CHANGED_AT),
        };
        let field = |name: &str| input.field_with_name(name).ok().map(|f| f.data_type());
        let attributes: HashMap<&str, &Attribute> = schema
            .attributes
            .iter()
            .map(|a| (a.column.as_str(), a))
            .collect();
        let mut plan = Plan {
            columns: Vec::with_capacity(columns.len()),
            duck: Vec::new(),
            duck_uuids: Vec::new(),
            check: version,
        };
        for (name, expr) in columns {
            let system = SYSTEM_COLUMNS.iter().find(|(n, _)| n == name);
            let (type_name, make) = match (system, attributes.get(name.as_str())) {
                (Some((_, t)), _) => {
                    let make = match (name.as_str(), driver) {
                        ("schema_id", _) => Some(Make::SchemaId(schema_id)),
                        ("deleted_at", Driver::Entities) => Some(Make::Zero),
                        ("deleted_at", Driver::ChangeLog) => Some(Make::DeltaDeleted),
                        (other, _) => {
                            let source = match other {
                                "row_id" => row_id,
                                "changed_at" => version,
                                other => other,
                            };
                            lake_type(t)
                                .and_then(|to| cast(field(source)?, &to))
                                .map(|conv| Make::Column {
                                    name: source.to_string(),
                                    conv,
                                })
                        }
                    };
                    (t.to_string(), make)
                }
                (None, Some(a)) => {
                    let source = match &a.binding {
                        Some(b) => b.column.clone(),
                        None => super::assemble::raw_column(a.id),
                    };
                    let t = duckdb_type(a);
                    let make = lake_type(&t)
                        .and_then(|to| convert_to(a, field(&source)?, &to))
                        .map(|conv| Make::Column { name: source, conv });
                    (t, make)
                }
                (None, None) => {
                    return Err(Error::Invariant(format!(
                        "lake column {name} is neither a system column nor an attribute"
                    )));
                }
            };
            let make = make.unwrap_or_else(|| {
                plan.duck.push(expr.clone());
                plan.duck_uuids.push(type_name.starts_with("UUID"));
                Make::Duck(plan.duck.len() - 1)
            });
            plan.columns.push((name.clone(), make));
        }
        Ok(plan)
    }

    /// The select list DuckDB computes — its expressions, then the input column that checks
    /// its rows' order — or `None` when the file is made without DuckDB.
    pub(crate) fn duck_select(&self) -> Option<String> {
        if self.duck.is_empty() {
            return None;
        }
        Some(format!("{}, m.{}", self.duck.join(", "), self.check))
    }

    /// The lake columns of `input` (assembled rows) and `duck` (DuckDB's result for the same
    /// rows, in the same order; empty without [`Plan::duck_select`]).
    fn make(&self, input: &RecordBatch, duck: &[ArrayRef]) -> Result<RecordBatch> {
        let rows = input.num_rows();
        let mut fields = Vec::with_capacity(self.columns.len());
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for (name, make) in &self.columns {
            let array: ArrayRef = match make {
                Make::SchemaId(id) => Arc::new(Int16Array::from_value(*id, rows)),
                Make::Zero => Arc::new(Int64Array::from_value(0, rows)),
                Make::DeltaDeleted => delta_deleted(input)?,
                Make::Column { name, conv } => convert(input_column(input, name)?, conv)?,
                Make::Duck(i) => duck
                    .get(*i)
                    .ok_or_else(|| {
                        Error::Invariant(format!("DuckDB computed no column {i} for {name}"))
                    })?
                    .clone(),
            };
            fields.push(lake_field(name, array.data_type()));
            arrays.push(array);
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
            .map_err(Error::arrow("lake columns of an assembled batch"))
    }
}

/// Writes the lake file of `input` (assembled rows, in file order) to `path`; `duck` is
/// DuckDB's result for [`Plan::duck_select`] over the same rows (ignored when there is none).
/// Returns the rows written.
pub(crate) fn write(
    plan: &Plan,
    input: &[RecordBatch],
    duck: Vec<RecordBatch>,
    path: &Path,
) -> Result<u64> {
    let rows: usize = input.iter().map(RecordBatch::num_rows).sum();
    let duck = if plan.duck.is_empty() {
        None
    } else {
        let schema = duck
            .first()
            .map(|b| b.schema())
            .ok_or_else(|| Error::Invariant("DuckDB returned no batch".into()))?;
        let all =
            concat_batches(&schema, &duck).map_err(Error::arrow("concatenate DuckDB's columns"))?;
        if all.num_rows() != rows || all.num_columns() != plan.duck.len() + 1 {
            return Err(Error::Invariant(format!(
                "DuckDB computed {} rows of {} columns for {rows} assembled rows",
                all.num_rows(),
                all.num_columns()
            )));
        }
        let mut columns = Vec::with_capacity(plan.duck.len());
        for (array, uuid) in all.columns().iter().zip(&plan.duck_uuids) {
            columns.push(duck_array(array, *uuid)?);
        }
        // DuckDB's rows must be the input's, in order: its copy of a version column proves it.
        let check = &all.columns()[plan.duck.len()];
        let mut offset = 0;
        for batch in input {
            let mine = input_column(batch, plan.check)?;
            if check.slice(offset, batch.num_rows()).to_data() != mine.to_data() {
                return Err(Error::Invariant(
                    "DuckDB's computed columns are not in the assembled rows' order".into(),
                ));
            }
            offset += batch.num_rows();
        }
        Some(columns)
    };
    let mut writer: Option<ArrowWriter<Piecewise<File>>> = None;
    let mut offset = 0;
    let parquet_error = |e: parquet::errors::ParquetError| Error::Parquet {
        path: path.display().to_string(),
        message: format!("write: {e}"),
    };
    for batch in input {
        let part: Vec<ArrayRef> = match &duck {
            Some(d) => d
                .iter()
                .map(|c| c.slice(offset, batch.num_rows()))
                .collect(),
            None => Vec::new(),
        };
        offset += batch.num_rows();
        let lake = plan.make(batch, &part)?;
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(open_lake_writer(path, &lake)?),
        };
        w.write(&lake).map_err(parquet_error)?;
    }
    let writer = writer.ok_or_else(|| Error::Invariant("a lake file of no batch".into()))?;
    writer.close().map_err(parquet_error)?;
    Ok(rows as u64)
}

/// Writes DuckDB's result `duck` — every column of a lake file of `schema`, in file order, as
/// [`super::Engine::query_arrow`] hands it over (UUIDs as text) — to a lake file at `path` with
/// the lake's writer. DuckDB's own Parquet writer delta-encodes a 32-bit integer column with
/// 64-bit deltas, which the `parquet` crate (compaction's reader) and pyarrow refuse once two
/// neighbouring values are more than 2^31 apart (docs/hazards.md L92). Returns the rows
/// written.
pub(crate) fn write_duck_result(
    schema: &SchemaDef,
    duck: &[RecordBatch],
    path: &Path,
) -> Result<u64> {
    let types: HashMap<&str, String> = SYSTEM_COLUMNS
        .iter()
        .map(|(n, t)| (*n, t.to_string()))
        .chain(
            schema
                .attributes
                .iter()
                .map(|a| (a.column.as_str(), duckdb_type(a))),
        )
        .collect();
    let mut lake = Vec::with_capacity(duck.len());
    for batch in duck {
        let mut fields = Vec::with_capacity(batch.num_columns());
        let mut arrays = Vec::with_capacity(batch.num_columns());
        for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
            let t = types.get(field.name().as_str()).ok_or_else(|| {
                Error::Invariant(format!(
                    "DuckDB's lake file column {} is neither a system column nor an attribute",
                    field.name()
                ))
            })?;
            let array = duck_array(array, t.starts_with("UUID"))?;
            // A list's items are named `element`, as the lake's writer names them.
            let array = match array.data_type() {
                DataType::List(_) => {
                    let list = array.as_list::<i32>();
                    with_items(list, list.values().clone())?
                }
                _ => array,
            };
            fields.push(lake_field(field.name(), array.data_type()));
            arrays.push(array);
        }
        lake.push(
            RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
                .map_err(Error::arrow("make a lake batch of DuckDB's result"))?,
        );
    }
    write_lake_file(path, &lake)
}

/// Writes lake rows that are already in their lake types (a table source's, docs/design.md
/// §9.2: all of one schema, in `row_id` order) to a lake file at `path`. Returns the rows
/// written.
pub fn write_lake_file(path: &Path, batches: &[RecordBatch]) -> Result<u64> {
    let parquet_error = |e: parquet::errors::ParquetError| Error::Parquet {
        path: path.display().to_string(),
        message: format!("write: {e}"),
    };
    let first = batches
        .first()
        .ok_or_else(|| Error::Invariant("a lake file of no batch".into()))?;
    let mut writer = open_lake_writer(path, first)?;
    let mut rows = 0u64;
    for b in batches {
        writer.write(b).map_err(parquet_error)?;
        rows += b.num_rows() as u64;
    }
    writer.close().map_err(parquet_error)?;
    Ok(rows)
}

/// A writer with the lake's file options and the encodings DuckDB picks for each type.
pub(crate) fn open_lake_writer(
    path: &Path,
    first: &RecordBatch,
) -> Result<ArrowWriter<Piecewise<File>>> {
    let mut props = lake_properties(path, &first.schema())?;
    // Under the seam that makes dictionaries tiny, a test looks at the writer's own fallback.
    let unique = match seam(DICTIONARY_SEAM) {
        Some(_) => Vec::new(),
        None => overflowing_dictionaries(first, DICTIONARY_PAGE_BYTES),
    };
    if !unique.is_empty() {
        let builder = unique.into_iter().fold(props.into_builder(), |b, col| {
            b.set_column_dictionary_enabled(col, false)
        });
        props = builder.build();
    }
    let file = crate::scratch::create_writer(path).map_err(|source| Error::Io {
        op: "create parquet file",
        path: path.to_path_buf(),
        source,
    })?;
    // No Arrow schema in the footer: the Parquet types say it all, as in DuckDB's files.
    let options = ArrowWriterOptions::new()
        .with_properties(props)
        .with_skip_arrow_metadata(true);
    ArrowWriter::try_new_with_options(file, first.schema(), options).map_err(|e| Error::Parquet {
        path: path.display().to_string(),
        message: format!("open writer: {e}"),
    })
}

/// The string columns of `batch` (a list's items included) whose dictionary would outgrow
/// `limit` bytes as the writer counts it (each distinct value's bytes and a 4-byte length): a
/// file written from `batch` gives them none. The writer would build that dictionary, compress
/// it as a page and then fall back to delta-length pages all the same; for a delta of unique
/// text that was most of its encoding time (docs/design.md §3.1). DuckDB's own writer also
/// looks at a column before choosing a dictionary.
fn overflowing_dictionaries(batch: &RecordBatch, limit: usize) -> Vec<ColumnPath> {
    // The dictionary is a row group's: only the first one's rows count.
    let batch = batch.slice(0, batch.num_rows().min(ROW_GROUP_SIZE));
    let mut out = Vec::new();
    for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
        let (path, t) = leaf(field);
        if *t != DataType::Utf8 {
            continue;
        }
        let values = match array.as_list_opt::<i32>() {
            // The items of the (possibly sliced) list's own rows.
            Some(list) => {
                let offsets = list.value_offsets();
                let (from, to) = match (offsets.first(), offsets.last()) {
                    (Some(&f), Some(&l)) => (f as usize, l as usize),
                    _ => continue,
                };
                list.values().slice(from, to.saturating_sub(from))
            }
            None => array.clone(),
        };
        if let Some(values) = values.as_string_opt::<i32>()
            && dictionary_overflows(values, limit)
        {
            out.push(path);
        }
    }
    out
}

/// Whether the distinct values of `values` take at least `limit` bytes in a dictionary page.
fn dictionary_overflows(values: &arrow::array::StringArray, limit: usize) -> bool {
    // Every value counted as often as it occurs bounds the distinct ones: below the limit
    // nothing needs hashing.
    let offsets = values.value_offsets();
    let (first, last) = (offsets.first(), offsets.last());
    let bytes = last.zip(first).map_or(0, |(l, f)| (l - f) as usize);
    if bytes.saturating_add(4 * values.len()) < limit {
        return false;
    }
    // Seeded per run: the values are the application's.
    let mut seen: std::collections::HashSet<&str, foldhash::fast::RandomState> =
        std::collections::HashSet::with_hasher(foldhash::fast::RandomState::default());
    let mut size = 0usize;
    for v in values.iter().flatten() {
        if seen.insert(v) {
            size += 4 + v.len();
            if size >= limit {
                return true;
            }
        }
    }
    false
}

/// A column's leaf in the file and its type: the column itself, or a list's items
/// (`name.list.element`).
fn leaf(field: &Field) -> (ColumnPath, &DataType) {
    match field.data_type() {
        DataType::List(item) => (
            ColumnPath::new(vec![
                field.name().clone(),
                "list".into(),
                item.name().clone(),
            ]),
            item.data_type(),
        ),
        t => (ColumnPath::from(field.name().as_str()), t),
    }
}

/// A test seam's value (`LAKECDC_TEST_PAGE_ROWS`, `LAKECDC_TEST_DICTIONARY_BYTES`): a number
/// above 0, in builds with the `testing` feature only.
fn seam(name: &str) -> Option<usize> {
    #[cfg(feature = "testing")]
    {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
    }
    #[cfg(not(feature = "testing"))]
    {
        let _ = name;
        None
    }
}

/// The lake's file options (docs/design.md §3.1.4) and the encodings DuckDB picks for each
/// type of `schema`.
pub(super) fn lake_properties(path: &Path, schema: &Schema) -> Result<WriterProperties> {
    let mut props = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL).map_err(
            |e| Error::Parquet {
                path: path.display().to_string(),
                message: e.to_string(),
            },
        )?))
        .set_max_row_group_row_count(Some(ROW_GROUP_SIZE))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_dictionary_page_size_limit(DICTIONARY_PAGE_BYTES);
    for field in schema.fields() {
        let (col, t) = leaf(field);
        let plain = match t {
            DataType::Int16 | DataType::Int32 | DataType::Int64 => Encoding::DELTA_BINARY_PACKED,
            DataType::Float64 => {
                // parquet-rs leaves NaN out of min/max, and DuckDB's reader then skips row
                // groups holding NaN for filters NaN satisfies (DuckDB's writer leaves min/max
                // out for such a chunk): no statistics for doubles.
                props = props.set_column_statistics_enabled(col.clone(), EnabledStatistics::None);
                Encoding::BYTE_STREAM_SPLIT
            }
            // DuckDB reads byte-stream-split pages of doubles only.
            DataType::FixedSizeBinary(_) => Encoding::PLAIN,
            DataType::Utf8 => {
                props = props.set_column_encoding(col, Encoding::DELTA_LENGTH_BYTE_ARRAY);
                continue;
            }
            _ => continue,
        };
        props = props
            .set_column_dictionary_enabled(col.clone(), false)
            .set_column_encoding(col, plain);
    }
    // Test seams: pages of this many rows (the writer's default is 20,000), written in
    // quarters, so that a test lake of a few thousand rows has row groups of several pages;
    // and a dictionary this small, so that a text column falls back to plain pages a quarter
    // page in, its pages then starting elsewhere than `row_id`'s (docs/design.md §9, runs).
    if let Some(rows) = seam("LAKECDC_TEST_PAGE_ROWS") {
        props = props
            .set_data_page_row_count_limit(rows)
            .set_write_batch_size((rows / 4).clamp(1, 1024));
    }
    if let Some(bytes) = seam(DICTIONARY_SEAM) {
        props = props.set_dictionary_page_size_limit(bytes);
    }
    Ok(props.build())
}

/// How attribute `a`'s slot or raw EAV value, of Arrow type `input`, becomes its lake value of
/// type `to` (see `export::bound_expr` and `export::eav_cast`); `None` leaves it to DuckDB.
fn convert_to(a: &Attribute, input: &DataType, to: &DataType) -> Option<Conv> {
    if a.value_type == ValueType::List {
        let (DataType::List(input), DataType::List(to)) = (input, to) else {
            return None;
        };
        let item = a.items_type.unwrap_or(ValueType::Text);
        let conv = conv_of(item, None, input.data_type(), to.data_type())?;
        return Some(Conv::List(Box::new(conv)));
    }
    conv_of(
        a.value_type,
        a.binding.as_ref().map(|b| b.encoding),
        input,
        to,
    )
}

/// [`convert_to`] for a value of type `t` (not a list) held in a slot of `encoding` or, with
/// `None`, in the EAV value column of its type.
fn conv_of(
    t: ValueType,
    encoding: Option<SlotEncoding>,
    input: &DataType,
    to: &DataType,
) -> Option<Conv> {
    let text = *input == DataType::Utf8;
    match (t, encoding) {
        // Text parsed as a timestamp: DuckDB's parser, whatever the attribute's type.
        (_, Some(SlotEncoding::Iso8601)) => None,
        (ValueType::Bool, Some(SlotEncoding::BoolText)) => text.then_some(Conv::BoolText),
        (_, Some(SlotEncoding::BoolText)) => None,
        (ValueType::Bool, _) => numeric(input).then_some(Conv::NonZero),
        (ValueType::Uuid, _) if text && *to == DataType::FixedSizeBinary(16) => {
            Some(Conv::UuidText)
        }
        _ => cast(input, to),
    }
}

/// `TRY_CAST` of an `input` value to `to`, where Rust does it exactly as DuckDB.
fn cast(input: &DataType, to: &DataType) -> Option<Conv> {
    let integer = |t: &DataType| matches!(t, DataType::Int16 | DataType::Int32 | DataType::Int64);
    if input == to {
        Some(Conv::Same)
    } else if integer(input) && (integer(to) || *to == DataType::Float64) {
        Some(Conv::Cast(to.clone()))
    } else if (input, to) == (&DataType::Float64, &DataType::Int64) {
        Some(Conv::DoubleToBigint)
    } else {
        None
    }
}

fn numeric(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::Float64
    )
}

fn input_column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| Error::Invariant(format!("assembled rows have no column {name}")))
}

fn convert(array: &ArrayRef, conv: &Conv) -> Result<ArrayRef> {
    let cast_error = Error::arrow("cast an assembled column to its lake type");
    Ok(match conv {
        Conv::Same => array.clone(),
        // Arrow's safe cast: an integer out of the target's range becomes NULL, as DuckDB's
        // TRY_CAST; integer → double rounds to nearest, as C++'s conversion.
        Conv::Cast(to) => {
            cast_with_options(array, to, &CastOptions::default()).map_err(cast_error)?
        }
        Conv::DoubleToBigint => {
            Arc::new(primitive::<Float64Type>(array)?.unary_opt::<_, Int64Type>(double_to_bigint))
        }
        Conv::NonZero => Arc::new(match array.data_type() {
            DataType::Int16 => non_zero::<Int16Type>(array)?,
            DataType::Int32 => non_zero::<Int32Type>(array)?,
            DataType::Int64 => non_zero::<Int64Type>(array)?,
            _ => non_zero::<Float64Type>(array)?,
        }),
        Conv::UuidText => uuid_column(array, |s| Ok(uuid_from_text(s)))?,
        Conv::BoolText => Arc::new(
            text(array)?
                .iter()
                .map(|v| v.and_then(bool_from_text))
                .collect::<BooleanArray>(),
        ),
        Conv::List(item) => {
            let list = array.as_list_opt::<i32>().ok_or_else(|| {
                Error::Invariant(format!(
                    "an assembled column is {}, not a list",
                    array.data_type()
                ))
            })?;
            with_items(list, convert(list.values(), item)?)?
        }
    })
}

/// `list` with `values` for its items (as many), named `element` as the lake names them.
fn with_items(list: &ListArray, values: ArrayRef) -> Result<ArrayRef> {
    let field = Arc::new(lake_field("element", values.data_type()));
    let rebuilt = ListArray::try_new(field, list.offsets().clone(), values, list.nulls().cloned())
        .map_err(Error::arrow("rebuild a list column"))?;
    Ok(Arc::new(rebuilt))
}

/// The 16-byte values of text `array`, each made by `parse` (`None`: NULL).
fn uuid_column(
    array: &ArrayRef,
    parse: impl Fn(&str) -> Result<Option<[u8; 16]>>,
) -> Result<ArrayRef> {
    let mut out = FixedSizeBinaryBuilder::with_capacity(array.len(), 16);
    for v in text(array)?.iter() {
        match v.map(&parse).transpose()?.flatten() {
            Some(id) => out
                .append_value(id)
                .map_err(Error::arrow("append to a uuid column"))?,
            None => out.append_null(),
        }
    }
    Ok(Arc::new(out.finish()))
}

/// `array` as text; the plan was made for another type otherwise.
fn text(array: &ArrayRef) -> Result<&arrow::array::StringArray> {
    array.as_string_opt::<i32>().ok_or_else(|| {
        Error::Invariant(format!(
            "an assembled column is {}, not text",
            array.data_type()
        ))
    })
}

/// DuckDB's `TRY_CAST(s AS UUID)` (its non-strict `UUID::FromString`): 32 hex digits of
/// either case, with any number of hyphens anywhere among them, the whole optionally in one
/// pair of braces; anything else (spaces included) is NULL. Made in Rust because DuckDB's
/// cast and the text it hands the UUID back as cost a flush with random ids several percent
/// of its CPU (docs/benchmarks.md).
pub(crate) fn uuid_from_text(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    let digits = match b {
        [] => return None,
        [b'{', inner @ .., b'}'] => inner,
        [b'{', ..] => return None,
        all => all,
    };
    let mut out = [0u8; 16];
    let mut count = 0usize;
    for &c in digits {
        if c == b'-' {
            continue;
        }
        let nibble = (c as char).to_digit(16)?;
        let byte = out.get_mut(count / 2)?;
        *byte |= (nibble as u8) << if count.is_multiple_of(2) { 4 } else { 0 };
        count += 1;
    }
    (count == 32).then_some(out)
}

/// `CASE lower(trim(s)) WHEN '1' THEN TRUE WHEN 'true' … WHEN 'f' THEN FALSE END` as DuckDB
/// computes it (`export::bound_expr`): `trim` removes Unicode space separators (category Zs,
/// not tabs or line breaks) from both ends, and no character outside ASCII lowercases to one
/// of the words' letters, so an ASCII comparison without case gives the same answer.
pub(crate) fn bool_from_text(s: &str) -> Option<bool> {
    let word = s.trim_matches(is_space_separator);
    let is = |w: &str| word.eq_ignore_ascii_case(w);
    if is("1") || is("true") || is("t") {
        Some(true)
    } else if is("0") || is("false") || is("f") {
        Some(false)
    } else {
        None
    }
}

/// Unicode's category Zs (space separators), what DuckDB's `trim` removes.
fn is_space_separator(c: char) -> bool {
    matches!(
        c,
        '\u{20}' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
    )
}

/// `array` as a `T` array; the plan was made for another type otherwise.
fn primitive<T: ArrowPrimitiveType>(array: &ArrayRef) -> Result<&PrimitiveArray<T>> {
    array.as_primitive_opt::<T>().ok_or_else(|| {
        Error::Invariant(format!(
            "an assembled column is {}, not {}",
            array.data_type(),
            T::DATA_TYPE
        ))
    })
}

/// DuckDB's `TRY_CAST(double AS BIGINT)`: finite values in `[-2^63, 2^63)` rounded half to
/// even (`std::nearbyint`), anything else NULL.
pub(crate) fn double_to_bigint(v: f64) -> Option<i64> {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0; // 2^63
    (v.is_finite() && (-LIMIT..LIMIT).contains(&v)).then(|| v.round_ties_even() as i64)
}

/// `(x <> 0)`: NULL stays NULL; NaN is not zero, -0.0 is.
fn non_zero<T: ArrowPrimitiveType>(array: &ArrayRef) -> Result<BooleanArray>
where
    T::Native: Default + PartialEq,
{
    Ok(BooleanArray::from_unary(primitive::<T>(array)?, |v| {
        v != T::Native::default()
    }))
}

/// A delta's `deleted_at` (see `export::system_columns`).
fn delta_deleted(input: &RecordBatch) -> Result<ArrayRef> {
    let int64 = |name: &str| -> Result<&Int64Array> {
        input_column(input, name)?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| Error::Invariant(format!("slot column {name} is not BIGINT")))
    };
    let (deleted, changed) = (
        int64(change_log::DELETED_AT)?,
        int64(change_log::CHANGED_AT)?,
    );
    let entity = input_column(input, entities::ROW_ID)?;
    Ok(Arc::new(Int64Array::from_iter((0..input.num_rows()).map(
        |i| {
            if deleted.is_valid(i) && deleted.value(i) > 0 {
                Some(deleted.value(i))
            } else if entity.is_null(i) {
                changed.is_valid(i).then(|| changed.value(i))
            } else {
                Some(0)
            }
        },
    ))))
}

/// A column DuckDB computed, as the lake holds it: UUIDs (`uuid`; DuckDB hands them over as
/// text) as 16 bytes, a list's items named `element`.
fn duck_array(array: &ArrayRef, uuid: bool) -> Result<ArrayRef> {
    match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            let values = if uuid {
                uuids_from_text(list.values())?
            } else {
                list.values().clone()
            };
            with_items(list, values)
        }
        DataType::Utf8 if uuid => uuids_from_text(array),
        _ => Ok(array.clone()),
    }
}

/// UUID text (DuckDB's rendering of its UUID type) as 16-byte values.
fn uuids_from_text(array: &ArrayRef) -> Result<ArrayRef> {
    uuid_column(array, |s| {
        uuid_from_text(s)
            .map(Some)
            .ok_or_else(|| Error::decode("a UUID computed by DuckDB", format!("{s:?}")))
    })
}

/// A lake file's field: nullable, as DuckDB writes every column; 16-byte values are UUIDs.
fn lake_field(name: &str, t: &DataType) -> Field {
    match t {
        DataType::FixedSizeBinary(16) => uuid_field(name, true),
        t => Field::new(name, t.clone(), true),
    }
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{Field, Schema};

    use super::*;
    use crate::engine::export::assembled_columns;
    use crate::schema::{ColumnBinding, SlotType};

    fn attr(id: i16, t: ValueType, binding: Option<(&str, SlotType, SlotEncoding)>) -> Attribute {
        Attribute {
            name: format!("a{id}"),
            id,
            value_type: t,
            items_type: (t == ValueType::List).then_some(ValueType::Uuid),
            binding: binding.map(|(column, slot, encoding)| ColumnBinding {
                column: column.into(),
                slot,
                encoding,
            }),
            column: format!("a{id}"),
        }
    }

    /// The plan of a base of `attributes` over entity columns typed as the snapshot reader
    /// types them.
    fn plan(attributes: Vec<Attribute>) -> Plan {
        let schema = SchemaDef {
            name: "t".into(),
            attributes,
        };
        let mut fields = vec![
            uuid_field("ltbase_row_id", false),
            Field::new("ltbase_created_at", DataType::Int64, false),
            Field::new("ltbase_updated_at", DataType::Int64, false),
            Field::new("ltbase_deleted_at", DataType::Int64, true),
            Field::new("text_01", DataType::Utf8, true),
            Field::new("smallint_01", DataType::Int16, true),
            Field::new("bigint_01", DataType::Int64, true),
        ];
        for a in schema.attributes.iter().filter(|a| a.binding.is_none()) {
            let t = match a.value_type {
                ValueType::Text | ValueType::Uuid => DataType::Utf8,
                ValueType::List => DataType::new_list(DataType::Utf8, true),
                _ => DataType::Float64,
            };
            fields.push(Field::new(
                super::super::assemble::raw_column(a.id),
                t,
                true,
            ));
        }
        let columns = assembled_columns(&schema, 7, Driver::Entities);
        Plan::new(&schema, 7, Driver::Entities, &Schema::new(fields), &columns).unwrap()
    }

    #[test]
    fn only_text_parsed_as_a_date_is_left_to_duckdb() {
        use SlotEncoding::*;
        let typed = vec![
            attr(
                1,
                ValueType::Text,
                Some(("text_01", SlotType::Text, Default)),
            ),
            attr(
                2,
                ValueType::Integer,
                Some(("bigint_01", SlotType::Bigint, Default)),
            ),
            attr(
                3,
                ValueType::Bool,
                Some(("smallint_01", SlotType::Smallint, BoolSmallint)),
            ),
            attr(
                4,
                ValueType::Datetime,
                Some(("bigint_01", SlotType::Bigint, UnixMs)),
            ),
            attr(
                6,
                ValueType::Bool,
                Some(("text_01", SlotType::Text, BoolText)),
            ),
            attr(
                7,
                ValueType::Uuid,
                Some(("text_01", SlotType::Text, Default)),
            ),
            attr(20, ValueType::Numeric, None),
            attr(21, ValueType::Bigint, None),
            attr(22, ValueType::Bool, None),
            attr(23, ValueType::Text, None),
            attr(24, ValueType::Uuid, None),
            attr(25, ValueType::List, None),
        ];
        let rust = plan(typed.clone());
        assert_eq!(rust.duck_select(), None, "every column made in Rust");
        let made = |p: &Plan, name: &str| p.columns.iter().find(|(n, _)| n == name).cloned();
        assert_eq!(
            made(&rust, "a21").map(|(_, m)| m),
            Some(Make::Column {
                name: "__lakecdc_eav_21".into(),
                conv: Conv::DoubleToBigint
            })
        );
        assert_eq!(made(&rust, "deleted_at").map(|(_, m)| m), Some(Make::Zero));
        for (name, source, conv) in [
            ("a6", "text_01", Conv::BoolText),
            ("a7", "text_01", Conv::UuidText),
            ("a24", "__lakecdc_eav_24", Conv::UuidText),
            (
                "a25",
                "__lakecdc_eav_25",
                Conv::List(Box::new(Conv::UuidText)),
            ),
        ] {
            let want = Make::Column {
                name: source.into(),
                conv,
            };
            assert_eq!(made(&rust, name).map(|(_, m)| m), Some(want), "{name}");
        }
        let mut parsed = typed;
        parsed.push(attr(
            5,
            ValueType::Date,
            Some(("text_01", SlotType::Text, Iso8601)),
        ));
        let mixed = plan(parsed);
        let left = &mixed.duck;
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(
            left[0].contains("TIMESTAMPTZ") && left[0].contains("text_01"),
            "{left:?}"
        );
        assert_eq!(mixed.duck_uuids, [false]);
        let select = mixed.duck_select().unwrap();
        assert!(
            select.ends_with(", m.ltbase_updated_at"),
            "the order check comes last"
        );
    }

    #[test]
    fn uuid_text_and_boolean_words_are_read_as_duckdb_reads_them() {
        let id = "0123456789abcdefFEDCBA9876543210";
        let bytes = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54,
            0x32, 0x10,
        ];
        for ok in [
            id.to_string(),
            format!("{{{id}}}"),
            "01234567-89ab-cdef-fedc-ba9876543210".into(),
            "-0-1-2345678-9abcdef-FEDCBA9876543210--".into(),
            "{01234567-89AB-CDEF-FEDC-BA9876543210}".into(),
        ] {
            assert_eq!(uuid_from_text(&ok), Some(bytes), "{ok}");
        }
        for bad in [
            "",
            "{",
            "{}",
            "}",
            "-",
            &id[1..],
            &format!("{id}0"),
            &format!(" {id}"),
            &format!("{{{id}"),
            &format!("{id}}}"),
            &format!("{{{{{id}}}}}"),
            "0123456789abcdefFEDCBA987654321g",
            "0123456789abcdefFEDCBA987654321ª",
        ] {
            assert_eq!(uuid_from_text(bad), None, "{bad:?}");
        }
        let words = [
            ("1", Some(true)),
            ("TRUE", Some(true)),
            ("\u{a0} t\u{3000}", Some(true)),
            ("0", Some(false)),
            ("False", Some(false)),
            (" f ", Some(false)),
            ("\tf", None),
            ("f\n", None),
            ("yes", None),
            ("", None),
            ("tru", None),
            ("\u{130}", None),
        ];
        for (word, want) in words {
            assert_eq!(bool_from_text(word), want, "{word:?}");
        }
    }

    #[test]
    fn uuids_duckdb_hands_over_as_text_become_bytes_and_a_bad_one_fails() {
        let text = "01234567-89ab-cdef-fedc-ba9876543210";
        let bytes = uuid::Uuid::parse_str(text).unwrap().into_bytes();
        let texts: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![Some(text), None]));
        let made = duck_array(&texts, true).unwrap();
        let made = made.as_fixed_size_binary();
        assert_eq!((made.value(0), made.is_null(1)), (&bytes[..], true));
        let list = ListArray::from_iter_primitive::<Int64Type, _, _>([Some([Some(1), None])]);
        let items: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![Some(text), None]));
        let list: ArrayRef = Arc::new(with_items(&list, items).unwrap().as_list::<i32>().clone());
        let made = duck_array(&list, true).unwrap();
        let made = made.as_list::<i32>();
        let DataType::List(field) = made.data_type() else {
            panic!("{:?}", made.data_type())
        };
        assert_eq!(field.name(), "element");
        let values = made.values().as_fixed_size_binary();
        assert_eq!((values.value(0), values.is_null(1)), (&bytes[..], true));
        let bad: ArrayRef = Arc::new(arrow::array::StringArray::from(vec!["not a uuid"]));
        let e = duck_array(&bad, true).unwrap_err().to_string();
        assert!(
            e.contains("a UUID computed by DuckDB") && e.contains("not a uuid"),
            "{e}"
        );
    }

    /// The same texts through the expressions DuckDB would compute (`export::bound_expr`),
    /// with more of the edges each rule has: both ways give the same values.
    #[test]
    fn duckdb_computes_what_rust_makes_of_uuid_text_and_boolean_words() {
        use crate::engine::{Engine, EngineConfig};
        let schema = SchemaDef {
            name: "t".into(),
            attributes: vec![
                attr(
                    6,
                    ValueType::Bool,
                    Some(("text_01", SlotType::Text, SlotEncoding::BoolText)),
                ),
                attr(
                    7,
                    ValueType::Uuid,
                    Some(("text_01", SlotType::Text, SlotEncoding::Default)),
                ),
            ],
        };
        let columns = assembled_columns(&schema, 7, Driver::Entities);
        let expr = |name: &str| columns.iter().find(|(n, _)| n == name).unwrap().1.clone();
        let id = "0123456789abcdefFEDCBA9876543210";
        let mut texts: Vec<String> = [
            "",
            " ",
            "1",
            "0",
            "t",
            "f",
            "T",
            "F",
            "true",
            "false",
            "TRUE",
            "fAlSe",
            " true ",
            "\u{a0}1\u{2009}",
            "\u{3000}f\u{202f}",
            "\u{1680}t\u{205f}",
            "\ttrue",
            "true\n",
            "\u{85}f",
            "\u{200b}t",
            "yes",
            "no",
            "2",
            "tr ue",
            "\u{130}",
            "\u{212a}",
            "ｔ",
            "{",
            "}",
            "{}",
            "-",
            "--",
            "{-}",
        ]
        .map(String::from)
        .to_vec();
        texts.extend([
            id.to_string(),
            format!("{{{id}}}"),
            format!("{{{{{id}}}}}"),
            format!("{{{id}"),
            format!("{id}}}"),
            format!(" {id}"),
            format!("{id} "),
            format!("{id}0"),
            id[1..].to_string(),
            format!("-{}-{}-", &id[..5], &id[5..]),
            "01234567-89ab-cdef-fedc-ba9876543210".into(),
            "01234567-89ab-cdef-fedc-ba987654321".into(),
            "0123456789abcdefFEDCBA987654321g".into(),
            "0123456789abcdefFEDCBA98765432１0".into(),
        ]);
        let values: Vec<String> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| format!("({i}, '{}')", t.replace('\'', "''")))
            .collect();
        let sql = format!(
            "SELECT {}, CAST({} AS VARCHAR) FROM (VALUES {}) AS m(i, text_01) ORDER BY i",
            expr("a6"),
            expr("a7"),
            values.join(", ")
        );
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        let batches = engine.query_arrow(&sql).unwrap();
        let mut at = 0;
        for b in &batches {
            let (words, ids) = (b.column(0).as_boolean(), b.column(1).as_string::<i32>());
            for row in 0..b.num_rows() {
                let text = &texts[at];
                let word = words.is_valid(row).then(|| words.value(row));
                assert_eq!(bool_from_text(text), word, "{text:?} as a boolean word");
                let id = ids.is_valid(row).then(|| ids.value(row).to_string());
                let rust = uuid_from_text(text).map(|b| uuid::Uuid::from_bytes(b).to_string());
                assert_eq!(rust, id, "{text:?} as a UUID");
                at += 1;
            }
        }
        assert_eq!(at, texts.len());
    }

    #[test]
    fn doubles_become_bigints_as_duckdb_rounds_them() {
        let cases = [
            (0.5, Some(0)),
            (1.5, Some(2)),
            (2.5, Some(2)),
            (-2.5, Some(-2)),
            (-0.0, Some(0)),
            (f64::NAN, None),
            (f64::INFINITY, None),
            (-9_223_372_036_854_775_808.0, Some(i64::MIN)),
            (9_223_372_036_854_775_808.0, None),
        ];
        for (v, want) in cases {
            assert_eq!(double_to_bigint(v), want, "{v}");
        }
    }

    #[test]
    fn a_text_column_whose_dictionary_would_overflow_gets_none() {
        use arrow::array::{ListBuilder, StringArray, StringBuilder};
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let n = 10_000;
        // 10,000 distinct values of 40 bytes: 440,000 bytes of dictionary, past 256 KiB.
        let unique: StringArray = (0..n).map(|i| Some(format!("{i:040}"))).collect();
        // 20 distinct values, 400,000 bytes in all: hashed, and small as a dictionary.
        let few: StringArray = (0..n).map(|i| Some(format!("{:040}", i % 20))).collect();
        // Under the limit even counted once per row: never hashed.
        let short: StringArray = (0..n).map(|i| Some(format!("{i}"))).collect();
        // Items named as the lake names them.
        let item = Field::new("element", DataType::Utf8, true);
        let mut tags = ListBuilder::new(StringBuilder::new()).with_field(item);
        for i in 0..n {
            tags.values().append_value(format!("tag-{i:036}"));
            tags.append(true);
        }
        let tags = tags.finish();
        let fields = vec![
            Field::new("unique", DataType::Utf8, true),
            Field::new("few", DataType::Utf8, true),
            Field::new("short", DataType::Utf8, true),
            Field::new("tags", tags.data_type().clone(), true),
        ];
        let columns: Vec<ArrayRef> = vec![
            Arc::new(unique),
            Arc::new(few),
            Arc::new(short),
            Arc::new(tags),
        ];
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        let off = overflowing_dictionaries(&batch, DICTIONARY_PAGE_BYTES);
        let names: Vec<String> = off.iter().map(|c| c.string()).collect();
        assert_eq!(names, ["unique", "tags.list.element"]);
        // The writer's own rule: each distinct value's bytes and 4, reaching the limit.
        let ab = StringArray::from(vec!["a", "b", "a", "b", "a"]);
        assert!(dictionary_overflows(&ab, 10));
        assert!(!dictionary_overflows(&ab, 11));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.parquet");
        assert_eq!(
            write_lake_file(&path, std::slice::from_ref(&batch)).unwrap(),
            n as u64
        );
        let reader = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let group = reader.metadata().row_group(0);
        let dictionary: Vec<(String, bool)> = group
            .columns()
            .iter()
            .map(|c| {
                let dict = c.dictionary_page_offset().is_some()
                    || c.encodings().any(|e| e == Encoding::RLE_DICTIONARY);
                (c.column_path().string(), dict)
            })
            .collect();
        let expected = [
            ("unique", false),
            ("few", true),
            ("short", true),
            ("tags.list.element", false),
        ];
        let expected: Vec<(String, bool)> =
            expected.iter().map(|(c, d)| (c.to_string(), *d)).collect();
        assert_eq!(dictionary, expected);
        // The values read back as written.
        let file = File::open(&path).unwrap();
        let read: Vec<RecordBatch> =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                .unwrap()
                .build()
                .unwrap()
                .map(|b| b.unwrap())
                .collect();
        let read = concat_batches(&read[0].schema(), &read).unwrap();
        for c in 0..4 {
            assert_eq!(
                read.column(c).as_ref(),
                batch.column(c).as_ref(),
                "column {c}"
            );
        }
    }
}
