//! The Arrow batches that travel from the source readers to the engine: their column names,
//! kinds and nullability, in the order the readers select them. Both sides name columns through
//! these constants, so a rename cannot leave one side behind.

use std::collections::HashMap;

use arrow::datatypes::{DataType, Field};

use super::SlotType;

/// One column of a batch: name, kind, nullable.
pub type BatchColumn = (&'static str, SlotType, bool);

/// Columns of the change-log batch: the slots a flush exports.
pub mod change_log {
    use super::{BatchColumn, SlotType};

    /// The entity's row id.
    pub const ROW_ID: &str = "row_id";
    /// The exported version (epoch ms).
    pub const CHANGED_AT: &str = "changed_at";
    /// Non-zero for a tombstone.
    pub const DELETED_AT: &str = "deleted_at";
    /// The batch's columns, in order.
    pub const COLUMNS: [BatchColumn; 3] = [
        (ROW_ID, SlotType::Uuid, false),
        (CHANGED_AT, SlotType::Bigint, false),
        (DELETED_AT, SlotType::Bigint, true),
    ];
}

/// Columns of the entity batch; the schema's bound slot columns follow these.
pub mod entities {
    use super::{BatchColumn, SlotType};

    /// The entity's row id.
    pub const ROW_ID: &str = "ltbase_row_id";
    /// Creation time (epoch ms).
    pub const CREATED_AT: &str = "ltbase_created_at";
    /// Last update (epoch ms): the version a base file carries.
    pub const UPDATED_AT: &str = "ltbase_updated_at";
    /// Soft-delete time, NULL while live.
    pub const DELETED_AT: &str = "ltbase_deleted_at";
    /// The system columns, in order, before the bound slot columns.
    pub const SYSTEM: [BatchColumn; 4] = [
        (ROW_ID, SlotType::Uuid, false),
        (CREATED_AT, SlotType::Bigint, false),
        (UPDATED_AT, SlotType::Bigint, false),
        (DELETED_AT, SlotType::Bigint, true),
    ];
}

/// Columns of the EAV batch.
pub mod eav {
    use super::{BatchColumn, SlotType};
    use crate::schema::ValueType;

    /// The entity's row id.
    pub const ROW_ID: &str = "row_id";
    /// The attribute's id.
    pub const ATTR_ID: &str = "attr_id";
    /// A list item's index path; NULL when the schema has no list attribute.
    pub const ARRAY_INDICES: &str = "array_indices";
    /// A text-typed value.
    pub const VALUE_TEXT: &str = "value_text";
    /// A numeric-typed value.
    pub const VALUE_NUMERIC: &str = "value_numeric";
    /// The batch's columns, in order.
    pub const COLUMNS: [BatchColumn; 5] = [
        (ROW_ID, SlotType::Uuid, false),
        (ATTR_ID, SlotType::Smallint, false),
        (ARRAY_INDICES, SlotType::Text, true),
        (VALUE_TEXT, SlotType::Text, true),
        (VALUE_NUMERIC, SlotType::Double, true),
    ];

    /// The column holding a value of type `t`.
    pub fn value_column(t: ValueType) -> &'static str {
        match t {
            ValueType::Text | ValueType::List | ValueType::Uuid => VALUE_TEXT,
            ValueType::Smallint
            | ValueType::Integer
            | ValueType::Numeric
            | ValueType::Bigint
            | ValueType::Date
            | ValueType::Datetime
            | ValueType::Bool => VALUE_NUMERIC,
        }
    }
}

/// An Arrow field holding UUIDs (16-byte fixed binary with the `arrow.uuid` extension), which
/// DuckDB reads as its UUID type.
pub fn uuid_field(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::FixedSizeBinary(16), nullable).with_metadata(HashMap::from([(
        "ARROW:extension:name".to_string(),
        "arrow.uuid".to_string(),
    )]))
}

/// The Arrow field of a batch column of `kind`.
pub fn field(name: &str, kind: SlotType, nullable: bool) -> Field {
    match kind {
        SlotType::Uuid => uuid_field(name, nullable),
        SlotType::Smallint => Field::new(name, DataType::Int16, nullable),
        SlotType::Integer => Field::new(name, DataType::Int32, nullable),
        SlotType::Bigint => Field::new(name, DataType::Int64, nullable),
        SlotType::Double => Field::new(name, DataType::Float64, nullable),
        SlotType::Text => Field::new(name, DataType::Utf8, nullable),
    }
}
