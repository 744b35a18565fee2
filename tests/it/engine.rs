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
    })
    .unwrap();
    assert_eq!(engine.setting("threads").unwrap(), "3");
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
        lakecdc::source::snapshot::uuid_field("row_id", false),
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
        lakecdc::source::snapshot::uuid_field("row_id", false),
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
    let err = lakecdc::lake::footer::check_file(&path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("deleted_at is missing") && err.contains("bad.parquet"),
        "{err}"
    );
}
