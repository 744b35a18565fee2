//! DuckDB writes lake Parquet: `row_id` as a 16-byte UUID, BIGINT as INT64, zstd, sorted.

use std::sync::Arc;

use arrow::array::{Array, FixedSizeBinaryArray, Int16Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use lakecdc::engine::{Engine, EngineConfig};
use parquet::basic::{Compression, LogicalType, Type as PhysicalType};
use parquet::file::reader::{FileReader, SerializedFileReader};

fn uuid_array(ids: &[String]) -> FixedSizeBinaryArray {
    FixedSizeBinaryArray::try_from_iter(
        ids.iter()
            .map(|s| uuid::Uuid::parse_str(s).unwrap().into_bytes()),
    )
    .unwrap()
}

#[test]
fn engine_is_configured_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&EngineConfig {
        threads: 3,
        memory_limit: "256MiB".into(),
        temp_directory: Some(dir.path().to_path_buf()),
        max_spill_bytes: Some(123_456_789),
    })
    .unwrap();
    assert_eq!(engine.setting("threads").unwrap(), "3");
    assert_eq!(
        engine.setting("max_temp_directory_size").unwrap(),
        "117.7 MiB"
    );
    assert!(engine.setting("memory_limit").unwrap().contains("MiB"));
    assert_eq!(
        engine.setting("temp_directory").unwrap(),
        dir.path().display().to_string()
    );
}

#[test]
fn uuid_row_id_is_a_16_byte_fixed_array_with_the_uuid_logical_type() {
    let ids: Vec<String> = (0..1000)
        .rev()
        .map(|i| format!("00000000-0000-7000-8000-{i:012}"))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("schema_id", DataType::Int16, false),
        lakecdc::schema::batch::uuid_field("row_id", false),
        Field::new("changed_at", DataType::Int64, false),
        Field::new("deleted_at", DataType::Int64, false),
        Field::new("ltbase_created_at", DataType::Int64, true),
    ]));
    let n = ids.len();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int16Array::from(vec![7i16; n])),
            Arc::new(uuid_array(&ids)),
            Arc::new(Int64Array::from((0..n as i64).collect::<Vec<_>>())),
            Arc::new(Int64Array::from(vec![0i64; n])),
            Arc::new(Int64Array::from(vec![Some(5i64); n])),
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.parquet");
    let engine = Engine::open(&EngineConfig::default()).unwrap();
    assert_eq!(engine.write_parquet(&[batch], &path).unwrap(), 1000);

    // The footer, read with the parquet crate.
    let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let meta = reader.metadata();
    let fields = meta
        .file_metadata()
        .schema_descr()
        .root_schema()
        .get_fields()
        .to_vec();
    let row_id = fields.iter().find(|f| f.name() == "row_id").unwrap();
    assert_eq!(
        row_id.get_physical_type(),
        PhysicalType::FIXED_LEN_BYTE_ARRAY
    );
    assert_eq!(
        row_id.get_basic_info().logical_type_ref(),
        Some(&LogicalType::Uuid)
    );
    match row_id.as_ref() {
        parquet::schema::types::Type::PrimitiveType { type_length, .. } => {
            assert_eq!(*type_length, 16)
        }
        other => panic!("row_id is not primitive: {other:?}"),
    }
    for col in ["changed_at", "deleted_at", "ltbase_created_at"] {
        let f = fields.iter().find(|f| f.name() == col).unwrap();
        assert_eq!(f.get_physical_type(), PhysicalType::INT64, "{col}");
    }
    assert!(matches!(
        meta.row_group(0).column(1).compression(),
        Compression::ZSTD(_)
    ));
    assert_eq!(meta.file_metadata().num_rows(), 1000);

    // The shared footer check agrees.
    let info = lakecdc::lake::footer::check_file(&path).unwrap();
    assert_eq!(info.row_count, 1000);
    let types: Vec<&str> = info.columns.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(types, ["SMALLINT", "UUID", "BIGINT", "BIGINT", "BIGINT"]);

    // Rows are sorted by row_id and the UUID bytes are the ids we wrote.
    let file = std::fs::File::open(&path).unwrap();
    let rows = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut got = Vec::new();
    for batch in rows {
        let batch = batch.unwrap();
        let col = batch.column_by_name("row_id").unwrap();
        let col = col
            .as_any()
            .downcast_ref::<arrow::array::FixedSizeBinaryArray>()
            .unwrap();
        for i in 0..col.len() {
            got.push(uuid::Uuid::from_slice(col.value(i)).unwrap().to_string());
        }
    }
    let mut want = ids;
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn a_file_missing_a_system_column_is_refused() {
    let schema = Arc::new(Schema::new(vec![
        lakecdc::schema::batch::uuid_field("row_id", false),
        Field::new("changed_at", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(uuid_array(&[
                "00000000-0000-7000-8000-000000000001".to_string()
            ])),
            Arc::new(Int64Array::from(vec![1i64])),
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.parquet");
    Engine::open(&EngineConfig::default())
        .unwrap()
        .write_parquet(&[batch], &path)
        .unwrap();
    let err = lakecdc::lake::footer::check_file(&path).unwrap_err();
    assert!(
        matches!(&err, lakecdc::error::Error::Parquet { path: p, .. } if p.ends_with("bad.parquet")),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("deleted_at is missing") && err.contains("bad.parquet"),
        "{err}"
    );
}

/// Every conversion the lake file writer makes in Rust (and every column it leaves to
/// DuckDB) gives exactly what DuckDB's export query gives: the same column types and the
/// same values, edge cases included (integer overflow, doubles rounded half to even, NaN,
/// infinities, NULLs, text parsed as UUID, date and boolean, lists), for a base and for a
/// delta with a hard delete and a tombstone.
mod lake_file_writer {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::Arc;

    use arrow::array::{ArrayRef, FixedSizeBinaryArray, Float64Array, Int16Array, Int32Array};
    use arrow::array::{AsArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use lakecdc::engine::Driver;
    use lakecdc::engine::export::Inputs;
    use lakecdc::engine::{Engine, EngineConfig};
    use lakecdc::schema::batch::uuid_field;
    use lakecdc::schema::{Attribute, ColumnBinding, Encoding, SchemaDef, SlotType, ValueType};
    use parquet::file::reader::{FileReader, SerializedFileReader};

    const ROWS: usize = 24;

    fn id(i: usize) -> [u8; 16] {
        uuid::Uuid::parse_str(&format!("018bcfe5-6801-7c4c-8a42-{i:012}"))
            .unwrap()
            .into_bytes()
    }

    fn attr(
        id: i16,
        t: ValueType,
        items: Option<ValueType>,
        bound: Option<(&str, SlotType, Encoding)>,
    ) -> Attribute {
        Attribute {
            name: format!("a{id}"),
            id,
            value_type: t,
            items_type: items,
            binding: bound.map(|(column, slot, encoding)| ColumnBinding {
                column: column.into(),
                slot,
                encoding,
            }),
            column: format!("a{id}"),
        }
    }

    fn schema() -> SchemaDef {
        use Encoding::*;
        use ValueType::*;
        SchemaDef {
            name: "every_kind".into(),
            attributes: vec![
                attr(1, Text, None, Some(("text_01", SlotType::Text, Default))),
                attr(2, Uuid, None, Some(("uuid_01", SlotType::Uuid, Default))),
                attr(
                    3,
                    Smallint,
                    None,
                    Some(("integer_01", SlotType::Integer, Default)),
                ),
                attr(
                    4,
                    Integer,
                    None,
                    Some(("bigint_01", SlotType::Bigint, Default)),
                ),
                attr(
                    5,
                    Bigint,
                    None,
                    Some(("double_01", SlotType::Double, Default)),
                ),
                attr(
                    6,
                    Numeric,
                    None,
                    Some(("integer_01", SlotType::Integer, Default)),
                ),
                attr(7, Date, None, Some(("bigint_01", SlotType::Bigint, UnixMs))),
                attr(
                    8,
                    Bool,
                    None,
                    Some(("smallint_01", SlotType::Smallint, BoolSmallint)),
                ),
                attr(
                    9,
                    Datetime,
                    None,
                    Some(("text_02", SlotType::Text, Iso8601)),
                ),
                attr(10, Bool, None, Some(("text_03", SlotType::Text, BoolText))),
                // Refused by the schema directory, but the engine must still match DuckDB.
                attr(11, Uuid, None, Some(("text_04", SlotType::Text, Default))),
                attr(
                    12,
                    Numeric,
                    None,
                    Some(("double_01", SlotType::Double, Default)),
                ),
                attr(20, Text, None, None),
                attr(21, Smallint, None, None),
                attr(22, Numeric, None, None),
                attr(23, Bigint, None, None),
                attr(24, Datetime, None, None),
                attr(25, Bool, None, None),
                attr(26, Uuid, None, None),
                attr(27, List, Some(Text), None),
                attr(28, List, Some(Uuid), None),
                attr(29, List, Some(Integer), None),
                attr(30, List, Some(Bigint), None),
                attr(31, List, Some(Bool), None),
            ],
        }
    }

    /// Doubles at every edge of `TRY_CAST(double AS BIGINT)` and `(x <> 0)`.
    const DOUBLES: [f64; ROWS] = [
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        0.49999999999999994,
        -0.0,
        0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        // 2^63 (out of BIGINT's range), -2^63 (in it), the largest double below 2^63.
        (1u64 << 63) as f64,
        -((1u64 << 63) as f64),
        ((1u64 << 63) - 1024) as f64,
        1e300,
        -1e300,
        4503599627370497.0,
        123.456,
        -7.0,
        1.0,
        32767.5,
        -32768.5,
        2147483647.5,
    ];

    fn entities(rows: impl Iterator<Item = usize>) -> RecordBatch {
        let rows: Vec<usize> = rows.collect();
        let texts = [
            "",
            "x",
            "2024-02-29T12:34:56Z",
            "2024-02-29",
            "not a date",
            "true",
            "F",
            " 1 ",
            "yes",
        ];
        let text = |k: usize| -> ArrayRef {
            Arc::new(StringArray::from_iter(rows.iter().map(|&i| {
                (i % 7 != 3).then(|| texts[(i + k) % texts.len()].to_string())
            })))
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    rows.iter().map(|&i| Some(id(i))),
                    16,
                )
                .unwrap(),
            ),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|&i| 1_700_000_000_000 + i as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|&i| 1_700_000_000_100 + i as i64),
            )),
            Arc::new(Int64Array::from_iter(rows.iter().map(|_| None::<i64>))),
            text(0),
            text(2),
            text(5),
            Arc::new(StringArray::from_iter(rows.iter().map(|&i| match i % 4 {
                0 => Some(format!("{{{}}}", uuid::Uuid::from_bytes(id(i)))),
                1 => Some(uuid::Uuid::from_bytes(id(i)).simple().to_string()),
                2 => Some("not-a-uuid".to_string()),
                _ => None,
            }))),
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    rows.iter().map(|&i| (i % 5 != 0).then(|| id(i + 100))),
                    16,
                )
                .unwrap(),
            ),
            Arc::new(Int16Array::from_iter(rows.iter().map(|&i| {
                (i % 6 != 5).then(|| [0i16, 1, -1, i16::MAX, i16::MIN][i % 5])
            }))),
            Arc::new(Int32Array::from_iter(rows.iter().map(|&i| {
                (i % 9 != 8)
                    .then(|| [0, 32767, 32768, -32768, -32769, i32::MAX, i32::MIN, 7][i % 8])
            }))),
            Arc::new(Int64Array::from_iter(rows.iter().map(|&i| {
                (i % 9 != 8).then(|| {
                    [
                        0,
                        i64::from(i32::MAX) + 1,
                        i64::from(i32::MIN),
                        i64::MAX,
                        i64::MIN,
                        1_700_000_000_000,
                        -1,
                    ][i % 7]
                })
            }))),
            Arc::new(Float64Array::from_iter(
                rows.iter()
                    .map(|&i| (i % 11 != 10).then(|| DOUBLES[i % ROWS])),
            )),
        ];
        let fields = vec![
            uuid_field("ltbase_row_id", false),
            Field::new("ltbase_created_at", DataType::Int64, false),
            Field::new("ltbase_updated_at", DataType::Int64, false),
            Field::new("ltbase_deleted_at", DataType::Int64, true),
            Field::new("text_01", DataType::Utf8, true),
            Field::new("text_02", DataType::Utf8, true),
            Field::new("text_03", DataType::Utf8, true),
            Field::new("text_04", DataType::Utf8, true),
            uuid_field("uuid_01", true),
            Field::new("smallint_01", DataType::Int16, true),
            Field::new("integer_01", DataType::Int32, true),
            Field::new("bigint_01", DataType::Int64, true),
            Field::new("double_01", DataType::Float64, true),
        ];
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    /// (row, attr_id, array_indices, value_text, value_numeric)
    type EavRow = (usize, i16, String, Option<String>, Option<f64>);

    fn eav(rows: impl Iterator<Item = usize>) -> RecordBatch {
        let mut r: Vec<EavRow> = Vec::new();
        for i in rows {
            let d = DOUBLES[(i * 7) % ROWS];
            r.push((i, 20, String::new(), Some(format!("label {i}")), None));
            r.push((i, 21, String::new(), None, Some(d)));
            r.push((i, 22, String::new(), None, Some(DOUBLES[i % ROWS])));
            r.push((i, 23, String::new(), None, Some(DOUBLES[i % ROWS])));
            if i % 3 != 0 {
                r.push((i, 24, String::new(), None, Some(d)));
            }
            r.push((i, 25, String::new(), None, Some(DOUBLES[(i + 5) % ROWS])));
            let u = uuid::Uuid::from_bytes(id(i + 500));
            let texts = [u.to_string(), "bad".to_string(), u.simple().to_string()];
            r.push((i, 26, String::new(), Some(texts[i % 3].clone()), None));
            match i % 4 {
                0 => r.push((i, 27, String::new(), None, None)),
                1 => {}
                _ => {
                    for k in [2, 0, 10] {
                        r.push((i, 27, k.to_string(), Some(format!("item {k}")), None));
                    }
                }
            }
            r.push((i, 28, "0".into(), Some(u.to_string()), None));
            r.push((
                i,
                28,
                "1".into(),
                Some(uuid::Uuid::from_bytes(id(i)).to_string()),
                None,
            ));
            r.push((i, 29, "0".into(), None, Some(d)));
            for k in 0..i % 3 {
                let v = DOUBLES[(i + 3 * k) % ROWS];
                r.push((i, 30, k.to_string(), None, Some(v)));
                r.push((i, 31, k.to_string(), None, Some(v)));
            }
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    r.iter().map(|x| Some(id(x.0))),
                    16,
                )
                .unwrap(),
            ),
            Arc::new(Int16Array::from_iter_values(r.iter().map(|x| x.1))),
            Arc::new(StringArray::from_iter_values(
                r.iter().map(|x| x.2.as_str()),
            )),
            Arc::new(StringArray::from_iter(r.iter().map(|x| x.3.clone()))),
            Arc::new(Float64Array::from_iter(r.iter().map(|x| x.4))),
        ];
        let fields = vec![
            uuid_field("row_id", false),
            Field::new("attr_id", DataType::Int16, false),
            Field::new("array_indices", DataType::Utf8, false),
            Field::new("value_text", DataType::Utf8, true),
            Field::new("value_numeric", DataType::Float64, true),
        ];
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    fn created_by(path: &Path) -> String {
        let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
        reader
            .metadata()
            .file_metadata()
            .created_by()
            .unwrap_or_default()
            .to_string()
    }

    /// The first column of DuckDB's result for `sql`, which is text.
    fn texts(engine: &Engine, sql: &str) -> Vec<String> {
        let mut out = Vec::new();
        for b in engine.query_arrow(sql).unwrap() {
            let col = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            out.extend(col.iter().map(|v| v.unwrap_or_default().to_string()));
        }
        out
    }

    /// Rows of `path` that `other` does not hold (as multisets), rendered as text.
    fn rows_missing(engine: &Engine, path: &Path, other: &Path) -> Vec<String> {
        texts(
            engine,
            &format!(
                "SELECT CAST(t AS VARCHAR) FROM (SELECT * FROM read_parquet('{}') EXCEPT ALL SELECT * FROM read_parquet('{}')) t",
                path.display(),
                other.display()
            ),
        )
    }

    /// DuckDB's answer to `select` over the file at `path` (as `f`), as text.
    fn answer(engine: &Engine, path: &Path, select: &str) -> String {
        let sql = format!(
            "WITH f AS (SELECT * FROM read_parquet('{}')) SELECT CAST(({select}) AS VARCHAR)",
            path.display()
        );
        texts(engine, &sql).remove(0)
    }

    fn same_file(driver: Driver, inputs: Inputs<'_>, rows: u64) {
        let def = schema();
        let dir = tempfile::tempdir().unwrap();
        let (written, reference) = (
            dir.path().join("rust.parquet"),
            dir.path().join("duckdb.parquet"),
        );
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        assert_eq!(
            engine.export(&def, 42, driver, inputs, &written).unwrap(),
            rows
        );
        assert_eq!(
            engine
                .export_pivoted(&def, 42, driver, inputs, &reference)
                .unwrap(),
            rows
        );
        // With columns for DuckDB and no rows, DuckDB writes the file (it has no batch to
        // hand over); otherwise the parquet crate does, of DuckDB's pivot too (L92).
        let writer = if rows > 0 { "parquet-rs" } else { "DuckDB" };
        for file in [&written, &reference] {
            assert!(created_by(file).starts_with(writer), "{}", created_by(file));
        }
        let columns = |p: &Path| -> BTreeMap<usize, (String, String)> {
            let info = lakecdc::lake::footer::check_file(p).unwrap();
            assert_eq!(info.row_count, rows as i64);
            info.columns.into_iter().enumerate().collect()
        };
        assert_eq!(columns(&written), columns(&reference));
        assert_eq!(
            rows_missing(&engine, &written, &reference),
            Vec::<String>::new()
        );
        assert_eq!(
            rows_missing(&engine, &reference, &written),
            Vec::<String>::new()
        );
        // The file's rows are in row-id order.
        let unordered = "SELECT count(*) FILTER (WHERE row_id <= lag) \
                         FROM (SELECT row_id, lag(row_id) OVER () AS lag FROM f)";
        assert_eq!(answer(&engine, &written, unordered), "0");
    }

    #[test]
    fn a_base_is_what_duckdb_makes_of_the_same_rows() {
        // Two pages, as init stages them.
        let entities = [entities(0..10), entities(10..ROWS * 3)];
        let eav = [eav(0..10), eav(10..ROWS * 3)];
        let inputs = Inputs {
            change_log: &[],
            entities: &entities,
            eav: &eav,
        };
        same_file(Driver::Entities, inputs, (ROWS * 3) as u64);
    }

    /// `batch` (EAV rows) as the reader hands it over: the empty index as NULL.
    fn as_read(batch: &RecordBatch) -> RecordBatch {
        let indices = batch.column(2).as_string::<i32>();
        let mut cols = batch.columns().to_vec();
        cols[2] = Arc::new(StringArray::from_iter(
            indices.iter().map(|v| v.filter(|t| !t.is_empty())),
        ));
        let mut fields: Vec<Field> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields[2] = Field::new("array_indices", DataType::Utf8, true);
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
    }

    #[test]
    fn the_empty_index_read_as_null_makes_the_same_file() {
        let entities = [entities(0..ROWS * 3)];
        let typed = [eav(0..ROWS * 3)];
        let read = [as_read(&typed[0])];
        assert!(
            read[0].column(2).null_count() > ROWS * 3,
            "scalars and markers read as NULL"
        );
        let inputs = |eav| Inputs {
            change_log: &[],
            entities: &entities,
            eav,
        };
        // Rust's file and DuckDB's pivot agree on the NULL form …
        same_file(Driver::Entities, inputs(&read), (ROWS * 3) as u64);
        // … and it is the file of the empty index itself.
        let dir = tempfile::tempdir().unwrap();
        let (from_null, from_empty) = (
            dir.path().join("null.parquet"),
            dir.path().join("empty.parquet"),
        );
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        let def = schema();
        for (eav, path) in [(&read, &from_null), (&typed, &from_empty)] {
            engine
                .export(&def, 42, Driver::Entities, inputs(eav), path)
                .unwrap();
        }
        assert_eq!(
            rows_missing(&engine, &from_null, &from_empty),
            Vec::<String>::new()
        );
        assert_eq!(
            rows_missing(&engine, &from_empty, &from_null),
            Vec::<String>::new()
        );
        // The empty lists are there to be lost: attribute 27's marker rows.
        let empty = "SELECT count(*) FILTER (WHERE len(a27) = 0) FROM f";
        assert_eq!(
            answer(&engine, &from_null, empty),
            answer(&engine, &from_empty, empty)
        );
        assert_ne!(answer(&engine, &from_null, empty), "0");
    }

    #[test]
    fn a_large_file_of_many_pages_is_what_duckdb_makes_of_the_same_rows() {
        // Two row groups, 14 pages, DuckDB's columns over many of its chunks, and strings and
        // UUID list items past the dictionary limit.
        let n = 130_000;
        let pages: Vec<std::ops::Range<usize>> = (0..n)
            .step_by(10_000)
            .map(|a| a..(a + 10_000).min(n))
            .collect();
        let entities: Vec<RecordBatch> = pages.iter().map(|r| entities(r.clone())).collect();
        let eav: Vec<RecordBatch> = pages.iter().map(|r| eav(r.clone())).collect();
        let inputs = Inputs {
            change_log: &[],
            entities: &entities,
            eav: &eav,
        };
        same_file(Driver::Entities, inputs, n as u64);
    }

    #[test]
    fn zero_rows_make_a_zero_row_file_either_way() {
        let entities = [entities(0..0)];
        let eav = [eav(0..0)];
        let inputs = Inputs {
            change_log: &[],
            entities: &entities,
            eav: &eav,
        };
        same_file(Driver::Entities, inputs, 0);
        // Without columns for DuckDB to compute, the parquet crate writes it.
        let mut def = schema();
        def.attributes.retain(|a| a.id == 1 || a.id == 22);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.parquet");
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        assert_eq!(
            engine
                .export(&def, 42, Driver::Entities, inputs, &path)
                .unwrap(),
            0
        );
        assert!(created_by(&path).starts_with("parquet-rs"));
        let info = lakecdc::lake::footer::check_file(&path).unwrap();
        assert_eq!(info.row_count, 0);
        let names: Vec<&str> = info.columns.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[7..], ["a1", "a22"]);
    }

    #[test]
    fn a_filter_finds_nan_in_a_file_as_in_duckdb_s() {
        // Row groups whose only large double is NaN, which DuckDB orders above every number:
        // min/max statistics that leave NaN out would let DuckDB skip them.
        let mut def = schema();
        def.attributes.retain(|a| a.id == 22);
        let n = 130_000;
        let mut eav_rows = eav(0..n);
        let keep: Vec<u32> = (0..eav_rows.num_rows() as u32)
            .filter(|&i| {
                eav_rows
                    .column(1)
                    .as_any()
                    .downcast_ref::<Int16Array>()
                    .unwrap()
                    .value(i as usize)
                    == 22
            })
            .collect();
        eav_rows =
            arrow::compute::take_record_batch(&eav_rows, &arrow::array::UInt32Array::from(keep))
                .unwrap();
        let values: Vec<Option<f64>> = (0..n)
            .map(|i| Some(if i % 50_000 == 7 { f64::NAN } else { 1.0 }))
            .collect();
        let mut cols = eav_rows.columns().to_vec();
        cols[4] = Arc::new(Float64Array::from(values));
        let eav_rows = RecordBatch::try_new(eav_rows.schema(), cols).unwrap();
        let entities = [entities(0..n)];
        let eav = [eav_rows];
        let inputs = Inputs {
            change_log: &[],
            entities: &entities,
            eav: &eav,
        };
        let dir = tempfile::tempdir().unwrap();
        let (written, reference) = (
            dir.path().join("rust.parquet"),
            dir.path().join("duckdb.parquet"),
        );
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        engine
            .export(&def, 42, Driver::Entities, inputs, &written)
            .unwrap();
        engine
            .export_pivoted(&def, 42, Driver::Entities, inputs, &reference)
            .unwrap();
        let query = "SELECT count(*) FROM f WHERE a22 > 1000";
        assert_eq!(answer(&engine, &written, query), "3");
        assert_eq!(answer(&engine, &reference, query), "3");
    }

    #[test]
    fn a_delta_is_what_duckdb_makes_of_the_same_rows() {
        // Slots for every entity row, one hard-deleted row (no entity row) and tombstones.
        let n = ROWS * 2;
        let slots: Vec<usize> = (0..n + 1).rev().collect();
        let slot_batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                uuid_field("row_id", false),
                Field::new("changed_at", DataType::Int64, false),
                Field::new("deleted_at", DataType::Int64, true),
            ])),
            vec![
                Arc::new(
                    FixedSizeBinaryArray::try_from_iter(slots.iter().map(|&i| id(i))).unwrap(),
                ),
                Arc::new(Int64Array::from_iter_values(
                    slots.iter().map(|&i| 1_700_000_000_200 + i as i64),
                )),
                Arc::new(Int64Array::from_iter(slots.iter().map(|&i| match i % 5 {
                    0 => Some(1_700_000_000_300 + i as i64),
                    1 => Some(0),
                    _ => None,
                }))),
            ],
        )
        .unwrap();
        let entities = [entities(0..n)];
        let eav = [eav(0..n)];
        let inputs = Inputs {
            change_log: &[slot_batch],
            entities: &entities,
            eav: &eav,
        };
        same_file(Driver::ChangeLog, inputs, (n + 1) as u64);
    }
}
