//! The lake type of a table source's column, from the catalog (docs/design.md §9): integers,
//! floats, `numeric(p,s)` → DECIMAL(p,s) (without a declared precision, or above 38 digits:
//! DOUBLE), bool, text-likes and enums → UTF8, date, timestamp(tz) → TIMESTAMP(µs) (UTC for
//! `timestamptz`), uuid, json/jsonb → UTF8 with the JSON logical type, bytea → BINARY, arrays
//! of these → LIST; anything else is exported as its text.

use arrow::datatypes::{DataType, Field, TimeUnit};
use serde::Serialize;

/// The largest DECIMAL precision Parquet readers share (Arrow's Decimal128).
const MAX_DECIMAL_DIGITS: i32 = 38;

/// A column's type in the lake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LakeType {
    /// `smallint`.
    Int16,
    /// `integer`.
    Int32,
    /// `bigint`.
    Int64,
    /// `real`.
    Float32,
    /// `double precision`, and `numeric` without a usable declared precision.
    Float64,
    /// `numeric(p,s)`.
    Decimal {
        /// Digits.
        precision: u8,
        /// Digits after the point.
        scale: i8,
    },
    /// `boolean`.
    Bool,
    /// Text-likes, enums, and any type without a lake type of its own (as its text).
    Utf8,
    /// `json`, `jsonb`: their text, typed JSON.
    Json,
    /// `date`.
    Date,
    /// `timestamp` (`utc: false`) and `timestamptz` (`utc: true`), microseconds.
    Timestamp {
        /// Adjusted to UTC.
        utc: bool,
    },
    /// `uuid`.
    Uuid,
    /// `bytea`.
    Binary,
    /// An array of an element type.
    List {
        /// The element's type.
        item: Box<LakeType>,
    },
}

/// What the catalog says about a column's type (a domain already resolved to its base).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogType {
    /// `pg_type.typname` of the (base) type, e.g. `int8`, `_int4` for an array.
    pub name: String,
    /// `pg_type.typtype`: `b` base, `e` enum, `d` domain, …
    pub kind: String,
    /// The type modifier (`atttypmod`), -1 when none.
    pub typmod: i32,
    /// For an array: the element's name and kind.
    pub element: Option<(String, String)>,
}

impl LakeType {
    /// The lake type of a column of catalog type `t`.
    pub fn of(t: &CatalogType) -> Self {
        match &t.element {
            Some((name, kind)) => LakeType::List {
                item: Box::new(Self::scalar(name, kind, -1)),
            },
            None => Self::scalar(&t.name, &t.kind, t.typmod),
        }
    }

    fn scalar(name: &str, kind: &str, typmod: i32) -> Self {
        if kind == "e" {
            return LakeType::Utf8;
        }
        match name {
            "int2" => LakeType::Int16,
            "int4" => LakeType::Int32,
            "int8" => LakeType::Int64,
            "float4" => LakeType::Float32,
            "float8" => LakeType::Float64,
            "numeric" => numeric(typmod),
            "bool" => LakeType::Bool,
            "date" => LakeType::Date,
            "timestamp" => LakeType::Timestamp { utc: false },
            "timestamptz" => LakeType::Timestamp { utc: true },
            "uuid" => LakeType::Uuid,
            "json" | "jsonb" => LakeType::Json,
            "bytea" => LakeType::Binary,
            _ => LakeType::Utf8,
        }
    }

    /// The Arrow type the column is written as (UUID and JSON carry their Parquet logical type
    /// as field metadata, as the schemas' columns do).
    pub fn arrow(&self) -> DataType {
        match self {
            LakeType::Int16 => DataType::Int16,
            LakeType::Int32 => DataType::Int32,
            LakeType::Int64 => DataType::Int64,
            LakeType::Float32 => DataType::Float32,
            LakeType::Float64 => DataType::Float64,
            LakeType::Decimal { precision, scale } => DataType::Decimal128(*precision, *scale),
            LakeType::Bool => DataType::Boolean,
            LakeType::Utf8 | LakeType::Json => DataType::Utf8,
            LakeType::Date => DataType::Date32,
            LakeType::Timestamp { utc } => DataType::Timestamp(
                TimeUnit::Microsecond,
                utc.then(|| std::sync::Arc::from("UTC")),
            ),
            LakeType::Uuid => DataType::FixedSizeBinary(16),
            LakeType::Binary => DataType::Binary,
            LakeType::List { item } => {
                DataType::List(std::sync::Arc::new(Field::new("item", item.arrow(), true)))
            }
        }
    }

    /// The type as a person reads it, e.g. `DECIMAL(12,2)`, `LIST<INT32>`.
    pub fn describe(&self) -> String {
        match self {
            LakeType::Int16 => "INT16".into(),
            LakeType::Int32 => "INT32".into(),
            LakeType::Int64 => "INT64".into(),
            LakeType::Float32 => "FLOAT".into(),
            LakeType::Float64 => "DOUBLE".into(),
            LakeType::Decimal { precision, scale } => format!("DECIMAL({precision},{scale})"),
            LakeType::Bool => "BOOLEAN".into(),
            LakeType::Utf8 => "UTF8".into(),
            LakeType::Json => "JSON".into(),
            LakeType::Date => "DATE".into(),
            LakeType::Timestamp { utc: true } => "TIMESTAMP(µs, UTC)".into(),
            LakeType::Timestamp { utc: false } => "TIMESTAMP(µs)".into(),
            LakeType::Uuid => "UUID".into(),
            LakeType::Binary => "BINARY".into(),
            LakeType::List { item } => format!("LIST<{}>", item.describe()),
        }
    }
}

/// `numeric`'s typmod is `((precision << 16) | scale) + 4`; none (-1), a precision past 38 or a
/// negative scale (PostgreSQL 15 allows one) has no DECIMAL: DOUBLE.
fn numeric(typmod: i32) -> LakeType {
    if typmod < 4 {
        return LakeType::Float64;
    }
    let precision = ((typmod - 4) >> 16) & 0xffff;
    let raw_scale = (typmod - 4) & 0xffff;
    // The scale is an 11-bit signed number in PostgreSQL 15's typmod.
    let scale = if raw_scale >= 1024 {
        raw_scale - 2048
    } else {
        raw_scale
    };
    match (u8::try_from(precision), i8::try_from(scale)) {
        (Ok(p), Ok(s))
            if (1..=MAX_DECIMAL_DIGITS).contains(&precision) && s >= 0 && scale <= precision =>
        {
            LakeType::Decimal {
                precision: p,
                scale: s,
            }
        }
        _ => LakeType::Float64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, typmod: i32) -> CatalogType {
        CatalogType {
            name: name.into(),
            kind: "b".into(),
            typmod,
            element: None,
        }
    }

    #[test]
    fn catalog_types_map_as_the_design_says() {
        let of = |name: &str, typmod: i32| LakeType::of(&t(name, typmod));
        assert_eq!(of("int8", -1), LakeType::Int64);
        assert_eq!(of("float4", -1), LakeType::Float32);
        // numeric(12,2): typmod (12 << 16 | 2) + 4.
        assert_eq!(
            of("numeric", (12 << 16 | 2) + 4),
            LakeType::Decimal {
                precision: 12,
                scale: 2
            }
        );
        assert_eq!(
            of("numeric", -1),
            LakeType::Float64,
            "no declared precision"
        );
        assert_eq!(
            of("numeric", (50 << 16) + 4),
            LakeType::Float64,
            "over 38 digits"
        );
        assert_eq!(
            of("numeric", (5 << 16 | 2046) + 4),
            LakeType::Float64,
            "negative scale"
        );
        assert_eq!(of("timestamptz", -1), LakeType::Timestamp { utc: true });
        assert_eq!(of("jsonb", -1), LakeType::Json);
        assert_eq!(of("inet", -1), LakeType::Utf8, "anything else as text");
        let mood = CatalogType {
            name: "mood".into(),
            kind: "e".into(),
            typmod: -1,
            element: None,
        };
        assert_eq!(LakeType::of(&mood), LakeType::Utf8);
        let tags = CatalogType {
            name: "_int4".into(),
            kind: "b".into(),
            typmod: -1,
            element: Some(("int4".into(), "b".into())),
        };
        let list = LakeType::of(&tags);
        assert_eq!(list.describe(), "LIST<INT32>");
        assert!(matches!(list.arrow(), DataType::List(f) if f.data_type() == &DataType::Int32));
        assert_eq!(
            of("timestamptz", -1).arrow(),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
    }
}
