//! The oracle: the lake's current state (docs/design.md §3.1) computed from the manifest JSON and the
//! Parquet files with the parquet crate — not through lakecdc's own reader — and compared with
//! the writer's model of PostgreSQL for every row that is not dirty.

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::{
    Array, ArrayRef, BooleanArray, FixedSizeBinaryArray, Float64Array, Int16Array, Int32Array,
    Int64Array, ListArray, StringArray,
};
use arrow::datatypes::DataType;
use bytes::Bytes;
use lakecdc::store::ObjectStore;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::support::writer::Writer;

/// A value as the test sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum V {
    Null,
    Str(String),
    Int(i64),
    F(f64),
    Bool(bool),
    Uuid(Uuid),
    List(Vec<V>),
}

/// One row copy in the lake.
#[derive(Debug, Clone, PartialEq)]
pub struct LakeRow {
    pub changed_at: i64,
    pub deleted_at: i64,
    pub columns: BTreeMap<String, V>,
}

fn value(col: &ArrayRef, i: usize) -> V {
    if col.is_null(i) {
        return V::Null;
    }
    let any = col.as_any();
    match col.data_type() {
        DataType::Utf8 => V::Str(
            any.downcast_ref::<StringArray>()
                .unwrap()
                .value(i)
                .to_string(),
        ),
        DataType::Int16 => V::Int(any.downcast_ref::<Int16Array>().unwrap().value(i).into()),
        DataType::Int32 => V::Int(any.downcast_ref::<Int32Array>().unwrap().value(i).into()),
        DataType::Int64 => V::Int(any.downcast_ref::<Int64Array>().unwrap().value(i)),
        DataType::Float64 => V::F(any.downcast_ref::<Float64Array>().unwrap().value(i)),
        DataType::Boolean => V::Bool(any.downcast_ref::<BooleanArray>().unwrap().value(i)),
        DataType::FixedSizeBinary(16) => V::Uuid(
            Uuid::from_slice(any.downcast_ref::<FixedSizeBinaryArray>().unwrap().value(i)).unwrap(),
        ),
        DataType::List(_) => {
            let items = any.downcast_ref::<ListArray>().unwrap().value(i);
            V::List((0..items.len()).map(|j| value(&items, j)).collect())
        }
        other => panic!("unexpected column type {other}"),
    }
}

/// Every row copy of one Parquet file.
pub fn read_parquet(bytes: Bytes) -> Vec<(Uuid, LakeRow)> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let schema = batch.schema();
        for i in 0..batch.num_rows() {
            let mut columns = BTreeMap::new();
            for (f, col) in schema.fields().iter().zip(batch.columns()) {
                columns.insert(f.name().clone(), value(col, i));
            }
            let V::Uuid(row_id) = columns["row_id"] else {
                panic!("row_id is not a UUID")
            };
            let V::Int(changed_at) = columns["changed_at"] else {
                panic!("changed_at")
            };
            let V::Int(deleted_at) = columns["deleted_at"] else {
                panic!("deleted_at")
            };
            out.push((
                row_id,
                LakeRow {
                    changed_at,
                    deleted_at,
                    columns,
                },
            ));
        }
    }
    out
}

/// The paths the manifest at `key` records as retired (compaction's and init's `retired`
/// list), read directly from the store.
pub async fn retired_paths(store: &dyn ObjectStore, key: &str) -> BTreeSet<String> {
    let m = manifest_json(store, key).await.unwrap();
    m["retired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["path"].as_str().unwrap().to_string())
        .collect()
}

/// The manifest as plain JSON, read directly from the store.
pub async fn manifest_json(store: &dyn ObjectStore, key: &str) -> Option<serde_json::Value> {
    match store.get_bytes(key).await {
        Ok(got) => Some(serde_json::from_slice(&got.bytes).unwrap()),
        Err(e) if e.is_not_found() => None,
        Err(e) => panic!("manifest read failed: {e}"),
    }
}

/// The lake's current state: for each row the copy with the highest `changed_at` (ties:
/// tombstone first), tombstones removed. Also checks every listed file's checksum and size.
pub async fn lake_state(store: &dyn ObjectStore, manifest_key: &str) -> BTreeMap<Uuid, LakeRow> {
    let Some(m) = manifest_json(store, manifest_key).await else {
        return BTreeMap::new();
    };
    let mut best: BTreeMap<Uuid, LakeRow> = BTreeMap::new();
    for f in m["files"].as_array().unwrap() {
        let path = f["path"].as_str().unwrap();
        let bytes = store
            .get_bytes(path)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .bytes;
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        assert_eq!(
            f["checksum"].as_str(),
            Some(digest.as_str()),
            "{path}: checksum"
        );
        assert_eq!(
            f["size_bytes"].as_u64(),
            Some(bytes.len() as u64),
            "{path}: size"
        );
        let rows = read_parquet(bytes);
        assert_eq!(
            f["row_count"].as_u64(),
            Some(rows.len() as u64),
            "{path}: row_count"
        );
        for (id, row) in rows {
            let wins = match best.get(&id) {
                None => true,
                Some(cur) => {
                    (row.changed_at, row.deleted_at > 0) > (cur.changed_at, cur.deleted_at > 0)
                }
            };
            if wins {
                best.insert(id, row);
            }
        }
    }
    best.retain(|_, r| r.deleted_at == 0);
    best
}

/// Dirty row ids of the writer's schema.
pub async fn dirty(w: &Writer) -> BTreeSet<Uuid> {
    w.client
        .query(
            "SELECT row_id FROM change_log WHERE schema_id = $1 AND flushed_at = 0",
            &[&w.schema_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Asserts the lake equals the model for every non-dirty row. Returns (rows compared, dirty).
pub async fn assert_matches(
    w: &Writer,
    store: &dyn ObjectStore,
    manifest_key: &str,
) -> (usize, usize) {
    let dirty = dirty(w).await;
    assert_matches_except(w, store, manifest_key, dirty).await
}

/// Asserts the lake equals every live row of the model (as after `init`, which exports live
/// rows whether or not they are dirty). Returns the rows compared.
pub async fn assert_live_rows(w: &Writer, store: &dyn ObjectStore, manifest_key: &str) -> usize {
    assert_matches_except(w, store, manifest_key, BTreeSet::new())
        .await
        .0
}

async fn assert_matches_except(
    w: &Writer,
    store: &dyn ObjectStore,
    manifest_key: &str,
    dirty: BTreeSet<Uuid>,
) -> (usize, usize) {
    let lake = lake_state(store, manifest_key).await;
    assert_state_matches(w, &lake, dirty)
}

/// Asserts a current state read by any reader (`lake`: one live row per id) equals the model
/// for every row not in `dirty`. Returns (rows compared, dirty).
pub fn assert_state_matches(
    w: &Writer,
    lake: &BTreeMap<Uuid, LakeRow>,
    dirty: BTreeSet<Uuid>,
) -> (usize, usize) {
    let mut compared = 0;
    for (id, m) in &w.rows {
        if dirty.contains(id) {
            continue;
        }
        if m.soft_deleted {
            assert!(
                !lake.contains_key(id),
                "soft-deleted {id} is live in the lake"
            );
            continue;
        }
        let row = lake.get(id).unwrap_or_else(|| {
            panic!(
                "live row {id} (version {}) missing from the lake",
                m.version
            )
        });
        assert_eq!(row.changed_at, m.version, "{id}: version");
        assert_eq!(
            row.columns["ltbase_created_at"],
            V::Int(m.created_at),
            "{id}"
        );
        assert_eq!(row.columns["ltbase_updated_at"], V::Int(m.version), "{id}");
        assert_eq!(row.columns["ltbase_deleted_at"], V::Null, "{id}");
        assert_eq!(row.columns["schema_id"], V::Int(w.schema_id.into()), "{id}");
        for (col, want) in m.value.expected() {
            assert_eq!(row.columns.get(col), Some(&want), "{id}: column {col}");
        }
        compared += 1;
    }
    for id in lake.keys() {
        if !dirty.contains(id) {
            let live = w.rows.get(id).is_some_and(|m| !m.soft_deleted);
            assert!(live, "{id} is live in the lake but deleted in PostgreSQL");
        }
    }
    (compared, dirty.len())
}

/// Asserts two local lake files are the same file for a reader: column names and types, and
/// the same rows in the same (`row_id`) order (docs/hazards.md #210).
pub fn assert_same_file(a: &std::path::Path, b: &std::path::Path) {
    let footer = |p| lakecdc::lake::footer::check_file(p).unwrap().columns;
    assert_eq!(footer(a), footer(b), "column names and types");
    let rows = |p| read_parquet(std::fs::read(p).unwrap().into());
    let (ra, rb) = (rows(a), rows(b));
    assert!(ra.windows(2).all(|w| w[0].0 < w[1].0), "sorted by row id");
    if ra != rb {
        let first = ra.iter().zip(&rb).position(|(x, y)| x != y);
        panic!(
            "{} vs {} rows; first difference at {first:?}: {:?} vs {:?}",
            ra.len(),
            rb.len(),
            first.map(|i| &ra[i]),
            first.map(|i| &rb[i])
        );
    }
}

/// Which shapes list column `column` of a local lake file holds: [NULL, `[]`, two or more
/// items].
pub fn list_shapes(path: &std::path::Path, column: &str) -> [bool; 3] {
    let mut seen = [false; 3];
    for (_, row) in read_parquet(std::fs::read(path).unwrap().into()) {
        match &row.columns[column] {
            V::Null => seen[0] = true,
            V::List(items) if items.is_empty() => seen[1] = true,
            V::List(items) if items.len() >= 2 => seen[2] = true,
            _ => {}
        }
    }
    seen
}

/// `eav` with every non-empty `array_indices` value replaced by `f(value)`.
pub fn map_indices(
    eav: &arrow::record_batch::RecordBatch,
    f: impl Fn(&str) -> String,
) -> arrow::record_batch::RecordBatch {
    let idx = eav.schema().index_of("array_indices").unwrap();
    let old = eav
        .column(idx)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let new: StringArray = old
        .iter()
        .map(|v| v.map(|s| if s.is_empty() { String::new() } else { f(s) }))
        .collect();
    let mut columns = eav.columns().to_vec();
    columns[idx] = std::sync::Arc::new(new);
    arrow::record_batch::RecordBatch::try_new(eav.schema(), columns).unwrap()
}
