//! The domain model: schemas, their attributes, value types and column bindings, and the
//! Parquet column set a schema exports. Loaded from a schema directory by [`dir`]; column names
//! come from the one fold rule in [`columns`].

pub mod batch;
pub(crate) mod columns;
pub mod dir;

use std::fmt;

/// The value type of an attribute (`valueType` in the metadata files).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// Free text.
    Text,
    /// 16-bit integer.
    Smallint,
    /// 32-bit integer.
    Integer,
    /// 64-bit integer.
    Bigint,
    /// Any number; exported as DOUBLE.
    Numeric,
    /// A date, exported as epoch milliseconds.
    Date,
    /// A timestamp, exported as epoch milliseconds.
    Datetime,
    /// A UUID.
    Uuid,
    /// A boolean.
    Bool,
    /// A list of `items_type` values, one EAV row per element.
    List,
}

impl ValueType {
    /// Every value type, in the order the metadata documentation lists them.
    pub const ALL: [ValueType; 10] = [
        ValueType::Text,
        ValueType::Smallint,
        ValueType::Integer,
        ValueType::Bigint,
        ValueType::Numeric,
        ValueType::Date,
        ValueType::Datetime,
        ValueType::Uuid,
        ValueType::Bool,
        ValueType::List,
    ];

    /// The metadata spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ValueType::Text => "text",
            ValueType::Smallint => "smallint",
            ValueType::Integer => "integer",
            ValueType::Bigint => "bigint",
            ValueType::Numeric => "numeric",
            ValueType::Date => "date",
            ValueType::Datetime => "datetime",
            ValueType::Uuid => "uuid",
            ValueType::Bool => "bool",
            ValueType::List => "list",
        }
    }

    /// Parses the metadata spelling (exact, lowercase).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a bound attribute's value is encoded in its `entity_main` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// The column's natural representation.
    Default,
    /// Epoch milliseconds in a BIGINT column.
    UnixMs,
    /// ISO 8601 text.
    Iso8601,
    /// A boolean as 1/0 in a SMALLINT column.
    BoolSmallint,
    /// A boolean as '1'/'0' in a TEXT column.
    BoolText,
}

impl Encoding {
    /// Parses the metadata spelling; empty means default.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "" | "default" => Encoding::Default,
            "unix_ms" => Encoding::UnixMs,
            "iso8601" => Encoding::Iso8601,
            "bool_smallint" => Encoding::BoolSmallint,
            "bool_text" => Encoding::BoolText,
            _ => return None,
        })
    }

    /// The metadata spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Default => "default",
            Encoding::UnixMs => "unix_ms",
            Encoding::Iso8601 => "iso8601",
            Encoding::BoolSmallint => "bool_smallint",
            Encoding::BoolText => "bool_text",
        }
    }
}

/// The SQL type of an `entity_main` slot column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SlotType {
    /// `text_01..text_10`
    Text,
    /// `smallint_01..03`
    Smallint,
    /// `integer_01..03`
    Integer,
    /// `bigint_01..03`
    Bigint,
    /// `double_01..03`
    Double,
    /// `uuid_01..02`
    Uuid,
}

impl SlotType {
    /// The PostgreSQL type of the slot.
    pub fn sql(self) -> &'static str {
        match self {
            SlotType::Text => "TEXT",
            SlotType::Smallint => "SMALLINT",
            SlotType::Integer => "INTEGER",
            SlotType::Bigint => "BIGINT",
            SlotType::Double => "DOUBLE PRECISION",
            SlotType::Uuid => "UUID",
        }
    }
}

/// The typed slot columns of `entity_main`, in table order: (prefix, count, type).
pub const SLOT_FAMILIES: [(&str, u8, SlotType); 6] = [
    ("text", 10, SlotType::Text),
    ("smallint", 3, SlotType::Smallint),
    ("integer", 3, SlotType::Integer),
    ("bigint", 3, SlotType::Bigint),
    ("double", 3, SlotType::Double),
    ("uuid", 2, SlotType::Uuid),
];

/// Every slot column name with its type, in table order.
pub fn slot_columns() -> Vec<(String, SlotType)> {
    SLOT_FAMILIES
        .iter()
        .flat_map(|(prefix, n, ty)| (1..=*n).map(move |i| (format!("{prefix}_{i:02}"), *ty)))
        .collect()
}

/// The type of slot column `name`, if it is one.
pub fn slot_type(name: &str) -> Option<SlotType> {
    slot_columns()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
}

/// An attribute bound to an `entity_main` slot column instead of `eav_data`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnBinding {
    /// The slot column, e.g. `text_03`.
    pub column: String,
    /// The slot's SQL type.
    pub slot: SlotType,
    /// How the value is encoded there.
    pub encoding: Encoding,
}

/// One attribute of a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute {
    /// The attribute name as in the metadata (may contain dots).
    pub name: String,
    /// The attribute id (`eav_data.attr_id`).
    pub id: i16,
    /// Its value type.
    pub value_type: ValueType,
    /// For lists, the element type (default text).
    pub items_type: Option<ValueType>,
    /// Set when the attribute lives in an `entity_main` column.
    pub binding: Option<ColumnBinding>,
    /// The Parquet column name (the fold of `name`).
    pub column: String,
}

/// A registered schema with its attribute metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaDef {
    /// The schema name (registry key and file stem).
    pub name: String,
    /// Attributes sorted by name.
    pub attributes: Vec<Attribute>,
}

impl SchemaDef {
    /// Whether any attribute lives in `eav_data` (not bound to an `entity_main` column).
    pub fn has_eav(&self) -> bool {
        self.attributes.iter().any(|a| a.binding.is_none())
    }

    /// Whether any EAV attribute is a list (only lists read `eav_data.array_indices`).
    pub fn has_eav_list(&self) -> bool {
        self.attributes
            .iter()
            .any(|a| a.binding.is_none() && a.value_type == ValueType::List)
    }

    /// The Parquet columns every file of this schema carries, in file order: the system
    /// columns, then bound attributes by name, then EAV attributes by name (docs/design.md §3.1).
    pub fn export_columns(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = columns::SYSTEM_COLUMNS
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        let (bound, eav): (Vec<_>, Vec<_>) =
            self.attributes.iter().partition(|a| a.binding.is_some());
        for a in bound.into_iter().chain(eav) {
            out.push((a.column.clone(), columns::duckdb_type(a)));
        }
        out
    }
}
