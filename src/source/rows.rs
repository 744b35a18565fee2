//! Arrow batches built from PostgreSQL results in binary format, value by value: the
//! column builders, the batch layouts of `schema::batch`, and the bound slot columns of a schema.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryBuilder, FixedSizeBinaryArray, FixedSizeBinaryBuilder, Float64Builder,
    Int16Builder, Int32Builder, Int64Builder, StringArray,
};
use arrow::datatypes::{Field, Schema};
use arrow::record_batch::RecordBatch;
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, Type};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::schema::batch::{self, BatchColumn};
use crate::schema::{SchemaDef, SlotType};

/// A value's bytes in PostgreSQL's binary format, decoded by [`Column::push_binary`].
pub(super) struct Raw<'a>(&'a [u8]);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(raw))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// The distinct slot columns the schema binds, sorted by name.
pub(super) fn bound_columns(schema: &SchemaDef) -> Vec<(String, SlotType)> {
    let mut cols: Vec<(String, SlotType)> = schema
        .attributes
        .iter()
        .filter_map(|a| a.binding.as_ref().map(|b| (b.column.clone(), b.slot)))
        .collect();
    cols.sort();
    cols.dedup();
    cols
}

pub(super) fn batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(Error::arrow("build a batch of result rows"))
}

/// One Arrow column being built from result rows.
pub(super) enum Column {
    Uuid(FixedSizeBinaryBuilder),
    Smallint(Int16Builder),
    Integer(Int32Builder),
    Bigint(Int64Builder),
    Double(Float64Builder),
    /// Text is gathered as bytes and checked to be UTF-8 once per column, when finished: one
    /// pass over the whole buffer instead of one call per value.
    Text(BinaryBuilder),
}

impl Column {
    pub(super) fn new(kind: SlotType, rows: usize) -> Self {
        match kind {
            SlotType::Uuid => Self::Uuid(FixedSizeBinaryBuilder::with_capacity(rows, 16)),
            SlotType::Smallint => Self::Smallint(Int16Builder::with_capacity(rows)),
            SlotType::Integer => Self::Integer(Int32Builder::with_capacity(rows)),
            SlotType::Bigint => Self::Bigint(Int64Builder::with_capacity(rows)),
            SlotType::Double => Self::Double(Float64Builder::with_capacity(rows)),
            SlotType::Text => Self::Text(BinaryBuilder::with_capacity(rows, rows * 16)),
        }
    }

    /// Appends column `idx` of `row` (rows arrive in binary format, as binary COPY values do).
    pub(super) fn push(&mut self, row: &Row, idx: usize) -> Result<()> {
        // The error's text is built only on failure: this runs once per value.
        let raw = row
            .try_get::<_, Option<Raw>>(idx)
            .map_err(|e| Error::postgres(format!("decode result column {idx}"))(e))?;
        self.push_binary(raw.map(|r| r.0))
    }

    /// Appends one value in PostgreSQL's binary format (`None` is NULL).
    pub(super) fn push_binary(&mut self, raw: Option<&[u8]>) -> Result<()> {
        fn fixed<const N: usize>(raw: &[u8]) -> Result<[u8; N]> {
            raw.try_into().map_err(|_| {
                Error::decode(
                    "binary value",
                    format!("has {} bytes, expected {N}", raw.len()),
                )
            })
        }
        match (self, raw) {
            (Self::Uuid(b), None) => b.append_null(),
            (Self::Uuid(b), Some(v)) => b
                .append_value(fixed::<16>(v)?)
                .map_err(Error::arrow("append to a uuid column"))?,
            (Self::Smallint(b), v) => {
                b.append_option(v.map(fixed::<2>).transpose()?.map(i16::from_be_bytes))
            }
            (Self::Integer(b), v) => {
                b.append_option(v.map(fixed::<4>).transpose()?.map(i32::from_be_bytes))
            }
            (Self::Bigint(b), v) => {
                b.append_option(v.map(fixed::<8>).transpose()?.map(i64::from_be_bytes))
            }
            (Self::Double(b), v) => {
                b.append_option(v.map(fixed::<8>).transpose()?.map(f64::from_be_bytes))
            }
            (Self::Text(b), v) => b.append_option(v),
        }
        Ok(())
    }

    /// The column (`name`, for errors) as an Arrow array.
    pub(super) fn finish(&mut self, name: &str) -> Result<ArrayRef> {
        Ok(match self {
            Self::Uuid(b) => Arc::new(b.finish()),
            Self::Smallint(b) => Arc::new(b.finish()),
            Self::Integer(b) => Arc::new(b.finish()),
            Self::Bigint(b) => Arc::new(b.finish()),
            Self::Double(b) => Arc::new(b.finish()),
            Self::Text(b) => {
                let (offsets, values, nulls) = b.finish().into_parts();
                Arc::new(StringArray::try_new(offsets, values, nulls).map_err(|e| {
                    Error::decode(format!("column {name}"), format!("text is not UTF-8: {e}"))
                })?)
            }
        })
    }
}

/// An Arrow batch of `columns` (name, kind, nullable) built row by row, as rows arrive: each
/// row's values sit together in memory, so one pass over a row beats one pass per column.
pub(super) struct BatchBuilder {
    pub(super) fields: Vec<Field>,
    pub(super) builders: Vec<Column>,
}

impl BatchBuilder {
    pub(super) fn new(columns: &[BatchColumn], capacity: usize) -> Self {
        Self::of(columns.iter().copied(), capacity)
    }

    fn of<'a>(columns: impl Iterator<Item = (&'a str, SlotType, bool)>, capacity: usize) -> Self {
        let (fields, builders) = columns
            .map(|(name, kind, nullable)| {
                (
                    batch::field(name, kind, nullable),
                    Column::new(kind, capacity),
                )
            })
            .unzip();
        Self { fields, builders }
    }

    /// The entity batch: the system columns, then the schema's bound slot columns.
    pub(super) fn entities(bound: &[(String, SlotType)], capacity: usize) -> Self {
        let bound = bound
            .iter()
            .map(|(name, slot)| (name.as_str(), *slot, true));
        Self::of(
            batch::entities::SYSTEM.iter().copied().chain(bound),
            capacity,
        )
    }

    /// The EAV batch.
    pub(super) fn eav(capacity: usize) -> Self {
        Self::new(&batch::eav::COLUMNS, capacity)
    }

    pub(super) fn push(&mut self, row: &Row) -> Result<()> {
        for (idx, b) in self.builders.iter_mut().enumerate() {
            b.push(row, idx)?;
        }
        Ok(())
    }

    pub(super) fn finish(mut self) -> Result<RecordBatch> {
        let columns = self
            .builders
            .iter_mut()
            .zip(&self.fields)
            .map(|(b, f)| b.finish(f.name()))
            .collect::<Result<_>>()?;
        batch(self.fields, columns)
    }
}

/// The row id in column 0 of `batch` at `idx`.
pub(super) fn row_id_at(batch: &RecordBatch, idx: usize) -> Result<Uuid> {
    let ids = batch
        .column(0)
        .as_any()
        .downcast_ref::<FixedSizeBinaryArray>()
        .ok_or_else(|| Error::Invariant("row id column is not 16-byte binary".into()))?;
    Uuid::from_slice(ids.value(idx)).map_err(|e| Error::Invariant(format!("row id column: {e}")))
}
