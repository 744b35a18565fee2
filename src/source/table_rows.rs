//! A table source's rows as lake rows (docs/design.md §9.2): the select-list expression that
//! reads each exported column in a binary form this module decodes, and the decoding of each
//! row into Arrow builders of the column's lake type. The file starts with the lake's system
//! columns: `schema_id` (the source id), `row_id`, `changed_at`, `deleted_at` (0 for a live
//! row), then `ltbase_created_at` (unknown: NULL), `ltbase_updated_at` (= `changed_at`) and
//! `ltbase_deleted_at` (the tombstone's time), so every reader and job treats the file as any
//! other lake file.
//!
//! Decimals, text-likes, JSON and anything without a lake type of its own are read as text;
//! `numeric` without a declared precision as `float8`. Dates and timestamps keep PostgreSQL's
//! infinities as DuckDB's (the largest and smallest value the type holds).

use std::sync::Arc;

use arrow::array::{
    ArrayBuilder, ArrayRef, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder,
    FixedSizeBinaryBuilder, Float32Builder, Float64Builder, Int16Builder, Int32Builder,
    Int64Builder, ListBuilder, StringBuilder, TimestampMicrosecondBuilder, make_builder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, Type};

use super::capture::SourceColumn;
use super::table_types::LakeType;
use crate::config::quote_ident;
use crate::error::{Error, Result};
use crate::schema::batch::uuid_field;

/// Days from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
const PG_EPOCH_DAYS: i32 = 10_957;
/// Microseconds from 1970-01-01 to 2000-01-01.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// What decoding a table's rows is called in errors.
const DECODE_OP: &str = "decode a table source's row";

/// The select-list expression reading column `c` of the row aliased `alias`, in the binary
/// form [`RowsBuilder`] decodes.
pub fn select_expr(c: &SourceColumn, alias: &str) -> String {
    let col = format!("{alias}.{}", quote_ident(&c.name));
    match &c.lake {
        LakeType::Decimal { .. } | LakeType::Utf8 | LakeType::Json => format!("{col}::text"),
        LakeType::Float64 if c.pg_type.starts_with("numeric") => numeric_as_double(&col),
        LakeType::Float64 => format!("{col}::float8"),
        LakeType::List { item } => match item.as_ref() {
            LakeType::Utf8 | LakeType::Json | LakeType::Decimal { .. } => format!("{col}::text[]"),
            // Element by element, in storage order (as the decoder flattens a
            // multi-dimensional array): one element beyond a double's range must not stop the
            // source (docs/hazards.md L74).
            LakeType::Float64 if c.pg_type.starts_with("numeric") => format!(
                "CASE WHEN {col} IS NULL THEN NULL::float8[] ELSE ARRAY(SELECT {} \
                 FROM unnest({col}) WITH ORDINALITY AS lakecdc_e(v, o) ORDER BY o) END",
                numeric_as_double("lakecdc_e.v")
            ),
            LakeType::Float64 => format!("{col}::float8[]"),
            _ => col,
        },
        _ => col,
    }
}

/// An unconstrained `numeric` as a double, where the plain cast would stop the source for good
/// on a value beyond a double's range (`1e400` overflows, `1e-400` underflows to an error):
/// past the largest double it is ±Infinity, below half the smallest one 0, as the nearest
/// double; NaN and ±Infinity stay themselves.
pub(super) fn numeric_as_double(col: &str) -> String {
    format!(
        "CASE WHEN {col} = 'NaN'::numeric THEN 'NaN'::float8 \
         WHEN abs({col}) >= 1.7976931348623158079e308 THEN \
         CASE WHEN {col} > 0 THEN 'Infinity'::float8 ELSE '-Infinity'::float8 END \
         WHEN abs({col}) < 2.4703282292062328e-324 THEN 0::float8 \
         ELSE {col}::float8 END"
    )
}

/// The Arrow schema of a table source's lake file: the system columns, then `columns` under
/// their lake names. Every field is nullable, as in every lake file.
pub fn lake_schema(columns: &[SourceColumn]) -> SchemaRef {
    let mut fields = vec![
        Field::new("schema_id", DataType::Int16, true),
        uuid_field("row_id", true),
        Field::new("changed_at", DataType::Int64, true),
        Field::new("deleted_at", DataType::Int64, true),
        Field::new("ltbase_created_at", DataType::Int64, true),
        Field::new("ltbase_updated_at", DataType::Int64, true),
        Field::new("ltbase_deleted_at", DataType::Int64, true),
    ];
    for c in columns {
        fields.push(lake_field(&c.lake_name, &c.lake));
    }
    Arc::new(Schema::new(fields))
}

fn lake_field(name: &str, t: &LakeType) -> Field {
    match t {
        LakeType::Uuid => uuid_field(name, true),
        LakeType::Json => Field::new(name, DataType::Utf8, true)
            .with_metadata([("ARROW:extension:name".to_string(), "arrow.json".to_string())].into()),
        t => Field::new(name, t.arrow(), true),
    }
}

/// A column's raw binary value, whatever its type.
struct Raw<'a>(&'a [u8]);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(raw))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Lake rows built from a table's rows: `(row_id, changed_at, deleted_at)` then the payload
/// columns, in [`select_expr`]'s form, from column `first_payload` of each row on.
pub struct RowsBuilder {
    schema: SchemaRef,
    source_id: i16,
    types: Vec<LakeType>,
    row_ids: FixedSizeBinaryBuilder,
    changed: Int64Builder,
    deleted: Int64Builder,
    payload: Vec<Box<dyn ArrayBuilder>>,
    rows: usize,
}

impl RowsBuilder {
    /// An empty builder for `columns` of source `source_id`.
    pub fn new(source_id: i16, columns: &[SourceColumn], capacity: usize) -> Self {
        let schema = lake_schema(columns);
        let payload = schema.fields()[7..]
            .iter()
            .map(|f| make_builder(f.data_type(), capacity))
            .collect();
        Self {
            schema,
            source_id,
            types: columns.iter().map(|c| c.lake.clone()).collect(),
            row_ids: FixedSizeBinaryBuilder::with_capacity(capacity, 16),
            changed: Int64Builder::with_capacity(capacity),
            deleted: Int64Builder::with_capacity(capacity),
            payload,
            rows: 0,
        }
    }

    /// Appends one lake row: `row_id`, its version and its deletion time (0 when live), then
    /// the payload from column `first_payload` of `row` on (none for a tombstone).
    pub fn push(
        &mut self,
        row_id: uuid::Uuid,
        changed_at: i64,
        deleted_at: i64,
        row: Option<&Row>,
        first_payload: usize,
    ) -> Result<()> {
        self.push_with(row_id, changed_at, deleted_at, |i| match row {
            Some(row) => Ok(row
                .try_get::<_, Option<Raw>>(first_payload + i)
                .map_err(|e| Error::postgres(DECODE_OP)(e))?
                .map(|r| r.0)),
            None => Ok(None),
        })
    }

    /// [`Self::push`] from a binary `COPY` tuple `tuple` whose payload fields lie at `fields`
    /// (`None`: NULL), in [`select_expr`]'s form.
    pub fn push_fields(
        &mut self,
        row_id: uuid::Uuid,
        changed_at: i64,
        tuple: &[u8],
        fields: &[Option<std::ops::Range<usize>>],
    ) -> Result<()> {
        if fields.len() != self.types.len() {
            return Err(bad(format!(
                "{} fields for {} columns",
                fields.len(),
                self.types.len()
            )));
        }
        self.push_with(row_id, changed_at, 0, |i| {
            fields[i]
                .clone()
                .map(|r| tuple.get(r).ok_or_else(|| bad("a field past its tuple")))
                .transpose()
        })
    }

    /// Appends one lake row whose payload column `i` is `raw(i)` (read only for a live row).
    fn push_with<'r>(
        &mut self,
        row_id: uuid::Uuid,
        changed_at: i64,
        deleted_at: i64,
        mut raw: impl FnMut(usize) -> Result<Option<&'r [u8]>>,
    ) -> Result<()> {
        self.row_ids
            .append_value(row_id.as_bytes())
            .map_err(|e| Error::arrow("append a row id")(e))?;
        self.changed.append_value(changed_at);
        self.deleted.append_value(deleted_at);
        for (i, (b, t)) in self.payload.iter_mut().zip(&self.types).enumerate() {
            let value = match deleted_at {
                0 => raw(i)?,
                _ => None,
            };
            append(b.as_mut(), t, value)?;
        }
        self.rows += 1;
        Ok(())
    }

    /// The rows as one batch; the builder is empty again.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let n = self.rows;
        let changed = self.changed.finish();
        let deleted = self.deleted.finish();
        let tombstone = |v: i64| (v != 0).then_some(v);
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(arrow::array::Int16Array::from(vec![self.source_id; n])),
            Arc::new(self.row_ids.finish()),
            Arc::new(changed.clone()),
            Arc::new(deleted.clone()),
            Arc::new(arrow::array::Int64Array::new_null(n)),
            Arc::new(changed),
            Arc::new(
                deleted
                    .values()
                    .iter()
                    .map(|v| tombstone(*v))
                    .collect::<arrow::array::Int64Array>(),
            ),
        ];
        columns.extend(self.payload.iter_mut().map(|b| b.finish()));
        self.rows = 0;
        RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(Error::arrow("assemble a table source's rows"))
    }
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::decode(DECODE_OP, what.to_string())
}

fn downcast<T: 'static>(b: &mut dyn ArrayBuilder) -> Result<&mut T> {
    b.as_any_mut()
        .downcast_mut::<T>()
        .ok_or_else(|| Error::Invariant("a table column's builder is not of its type".into()))
}

fn fixed<const N: usize>(raw: &[u8], what: &str) -> Result<[u8; N]> {
    raw.try_into()
        .map_err(|_| bad(format!("{what} of {} bytes, expected {N}", raw.len())))
}

/// Appends one value of lake type `t` (NULL when `raw` is `None`) to `b`.
fn append(b: &mut dyn ArrayBuilder, t: &LakeType, raw: Option<&[u8]>) -> Result<()> {
    match t {
        LakeType::Int16 => downcast::<Int16Builder>(b)?.append_option(
            raw.map(|r| fixed::<2>(r, "smallint").map(i16::from_be_bytes))
                .transpose()?,
        ),
        LakeType::Int32 => downcast::<Int32Builder>(b)?.append_option(
            raw.map(|r| fixed::<4>(r, "integer").map(i32::from_be_bytes))
                .transpose()?,
        ),
        LakeType::Int64 => downcast::<Int64Builder>(b)?.append_option(
            raw.map(|r| fixed::<8>(r, "bigint").map(i64::from_be_bytes))
                .transpose()?,
        ),
        LakeType::Float32 => downcast::<Float32Builder>(b)?.append_option(
            raw.map(|r| fixed::<4>(r, "real").map(f32::from_be_bytes))
                .transpose()?,
        ),
        LakeType::Float64 => downcast::<Float64Builder>(b)?.append_option(
            raw.map(|r| fixed::<8>(r, "double").map(f64::from_be_bytes))
                .transpose()?,
        ),
        LakeType::Bool => downcast::<BooleanBuilder>(b)?.append_option(
            raw.map(|r| fixed::<1>(r, "boolean").map(|v| v[0] != 0))
                .transpose()?,
        ),
        LakeType::Utf8 | LakeType::Json => {
            let s = raw
                .map(|r| std::str::from_utf8(r).map_err(|e| bad(format!("text: {e}"))))
                .transpose()?;
            downcast::<StringBuilder>(b)?.append_option(s);
        }
        LakeType::Binary => downcast::<BinaryBuilder>(b)?.append_option(raw),
        LakeType::Uuid => {
            let b = downcast::<FixedSizeBinaryBuilder>(b)?;
            match raw {
                Some(r) => b
                    .append_value(fixed::<16>(r, "uuid")?)
                    .map_err(|e| Error::arrow("append a uuid")(e))?,
                None => b.append_null(),
            }
        }
        LakeType::Decimal { scale, .. } => {
            let v = raw
                .map(|r| {
                    let s = std::str::from_utf8(r).map_err(|e| bad(format!("numeric: {e}")))?;
                    decimal(s, *scale)
                })
                .transpose()?
                .flatten();
            downcast::<Decimal128Builder>(b)?.append_option(v);
        }
        LakeType::Date => downcast::<Date32Builder>(b)?.append_option(
            raw.map(|r| fixed::<4>(r, "date").map(|v| date(i32::from_be_bytes(v))))
                .transpose()?,
        ),
        LakeType::Timestamp { .. } => downcast::<TimestampMicrosecondBuilder>(b)?.append_option(
            raw.map(|r| fixed::<8>(r, "timestamp").map(|v| timestamp(i64::from_be_bytes(v))))
                .transpose()?,
        ),
        LakeType::List { item } => {
            let list = downcast::<ListBuilder<Box<dyn ArrayBuilder>>>(b)?;
            match raw {
                None => list.append(false),
                Some(r) => {
                    for element in elements(r)? {
                        append(list.values().as_mut(), item, element)?;
                    }
                    list.append(true);
                }
            }
        }
    }
    Ok(())
}

/// A date's days since 1970; PostgreSQL's `±infinity` become DuckDB's.
fn date(pg: i32) -> i32 {
    match pg {
        i32::MAX => i32::MAX,
        i32::MIN => -i32::MAX,
        d => d.saturating_add(PG_EPOCH_DAYS),
    }
}

/// A timestamp's microseconds since 1970; PostgreSQL's `±infinity` become DuckDB's.
fn timestamp(pg: i64) -> i64 {
    match pg {
        i64::MAX => i64::MAX,
        i64::MIN => -i64::MAX,
        t => t.saturating_add(PG_EPOCH_MICROS),
    }
}

/// A numeric's text as a DECIMAL of `scale` digits after the point (its unscaled value);
/// `NaN` (which a `numeric(p,s)` column may hold) is NULL.
fn decimal(text: &str, scale: i8) -> Result<Option<i128>> {
    if text == "NaN" {
        return Ok(None);
    }
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let scale = usize::try_from(scale).map_err(|_| bad(format!("numeric scale {scale}")))?;
    if frac.len() > scale || !int.bytes().chain(frac.bytes()).all(|c| c.is_ascii_digit()) {
        return Err(bad(format!(
            "numeric {text:?} does not fit its column's DECIMAL scale {scale}"
        )));
    }
    // The unscaled integer, digit by digit: the value's digits, then zeros up to the scale.
    let mut v: i128 = 0;
    let zeros = std::iter::repeat_n(b'0', scale - frac.len());
    for d in int.bytes().chain(frac.bytes()).chain(zeros) {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(i128::from(d - b'0')))
            .ok_or_else(|| bad(format!("numeric {text:?} is out of range")))?;
    }
    Ok(Some(if negative { -v } else { v }))
}

/// The elements of a binary array value, flattened in storage order (a multi-dimensional
/// array becomes one list).
fn elements(raw: &[u8]) -> Result<Vec<Option<&[u8]>>> {
    let word = |at: usize| -> Result<i32> {
        raw.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(i32::from_be_bytes)
            .ok_or_else(|| bad("a truncated array"))
    };
    let dims = usize::try_from(word(0)?).map_err(|_| bad("an array's dimensions"))?;
    let mut count: usize = usize::from(dims > 0);
    for d in 0..dims {
        let len = usize::try_from(word(12 + 8 * d)?).map_err(|_| bad("an array's length"))?;
        count = count.saturating_mul(len);
    }
    let mut at = 12 + 8 * dims;
    let mut out = Vec::with_capacity(count.min(raw.len()));
    for _ in 0..count {
        let len = word(at)?;
        at += 4;
        if len < 0 {
            out.push(None);
            continue;
        }
        let len = usize::try_from(len).map_err(|_| bad("an array element's length"))?;
        let v = raw
            .get(at..at + len)
            .ok_or_else(|| bad("a truncated array element"))?;
        out.push(Some(v));
        at += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_read_exactly_at_their_scale() {
        assert_eq!(decimal("12.30", 2).unwrap(), Some(1230));
        assert_eq!(decimal("-0.05", 2).unwrap(), Some(-5));
        assert_eq!(decimal("7", 2).unwrap(), Some(700));
        assert_eq!(decimal("NaN", 2).unwrap(), None);
        assert_eq!(
            decimal("99999999999999999999999999999999999999", 0).unwrap(),
            Some(99_999_999_999_999_999_999_999_999_999_999_999_999)
        );
        assert!(decimal("1.234", 2).is_err());
        assert!(decimal(&"9".repeat(40), 0).is_err(), "past i128");
    }

    #[test]
    fn infinities_and_epochs() {
        assert_eq!(date(0), PG_EPOCH_DAYS);
        assert_eq!(date(i32::MAX), i32::MAX);
        assert_eq!(date(i32::MIN), -i32::MAX);
        assert_eq!(timestamp(0), PG_EPOCH_MICROS);
        assert_eq!(timestamp(i64::MIN), -i64::MAX);
    }

    #[test]
    fn a_binary_array_is_flattened_with_its_nulls() {
        // int4[] '{{1,NULL},{3,4}}': 2 dims of 2, has nulls, element oid 23.
        let mut raw = Vec::new();
        for w in [2i32, 1, 23, 2, 1, 2, 1] {
            raw.extend_from_slice(&w.to_be_bytes());
        }
        for v in [Some(1i32), None, Some(3), Some(4)] {
            match v {
                Some(v) => {
                    raw.extend_from_slice(&4i32.to_be_bytes());
                    raw.extend_from_slice(&v.to_be_bytes());
                }
                None => raw.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        let got: Vec<Option<i32>> = elements(&raw)
            .unwrap()
            .into_iter()
            .map(|e| e.map(|b| i32::from_be_bytes(b.try_into().unwrap())))
            .collect();
        assert_eq!(got, vec![Some(1), None, Some(3), Some(4)]);
        // An empty array has no dimension.
        let empty: Vec<u8> = [0i32, 0, 23].iter().flat_map(|w| w.to_be_bytes()).collect();
        assert!(elements(&empty).unwrap().is_empty());
        assert!(elements(&raw[..30]).is_err(), "truncated");
    }
}
