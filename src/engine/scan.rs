//! `lakecdc_arrow(id)`: a DuckDB table function that scans Arrow batches held by lakecdc, so
//! an export reads a batch's rows straight from the Arrow buffers the source decoded them into
//! — no `CREATE TABLE` + appender copy into DuckDB storage first (that copy cost as much CPU as
//! writing the Parquet file). Batches are registered under an id for exactly as long as the
//! returned [`Registered`] guard lives; nothing outlives it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arrow::record_batch::RecordBatch;
use duckdb::core::{DataChunkHandle, LogicalTypeHandle, LogicalTypeId};
use duckdb::vtab::{
    BindInfo, InitInfo, TableFunctionInfo, VTab, record_batch_to_duckdb_data_chunk,
    to_duckdb_logical_type_for_field,
};

/// The name the parallel scan is registered under.
pub(super) const FUNCTION: &str = "lakecdc_arrow";
/// The name the in-order (single-threaded) scan is registered under.
pub(super) const ORDERED_FUNCTION: &str = "lakecdc_arrow_ordered";
/// Rows per emitted chunk: DuckDB's standard vector size.
const CHUNK_ROWS: usize = 2048;
/// Threads that may scan at once; DuckDB caps it at its own `threads` setting.
const MAX_THREADS: u64 = 64;

type Batches = Arc<Vec<RecordBatch>>;

fn registry() -> MutexGuard<'static, HashMap<u64, Batches>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, Batches>>> = OnceLock::new();
    // A panic while holding the lock cannot leave the map half-updated (single insert or
    // remove), so a poisoned lock is still usable.
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Batches visible to `lakecdc_arrow(id)` while this guard lives.
#[derive(Debug)]
pub(super) struct Registered {
    id: u64,
    ordered: bool,
}

impl Registered {
    /// Registers `batches` (all of one schema, at least one batch, possibly empty ones).
    /// Scanned by every DuckDB thread at once, in no particular order.
    pub(super) fn new(batches: Vec<RecordBatch>) -> Self {
        Self::register(batches, false)
    }

    /// Registers `batches` for a scan that emits their rows in order, on one thread: a query
    /// with no join, aggregate or sort over it keeps that order (DuckDB preserves insertion
    /// order by default).
    pub(super) fn in_order(batches: Vec<RecordBatch>) -> Self {
        Self::register(batches, true)
    }

    fn register(batches: Vec<RecordBatch>, ordered: bool) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        registry().insert(id, Arc::new(batches));
        Self { id, ordered }
    }

    /// The SQL that scans the batches.
    pub(super) fn scan_sql(&self) -> String {
        format!("{}({}::UBIGINT)", function_name(self.ordered), self.id)
    }
}

/// The name of the in-order or the parallel scan.
fn function_name(ordered: bool) -> &'static str {
    if ordered { ORDERED_FUNCTION } else { FUNCTION }
}

impl Drop for Registered {
    fn drop(&mut self) {
        registry().remove(&self.id);
    }
}

/// The table function; `PARALLEL` scans on every DuckDB thread, otherwise on one, in order.
pub(super) struct ArrowScan<const PARALLEL: bool>;

/// The batches being scanned.
pub(super) struct Bind {
    batches: Batches,
}

/// The scan position — (batch index, row offset in that batch) — and the columns the query
/// reads, by index into the batches' schema.
pub(super) struct Position {
    at: Mutex<(usize, usize)>,
    columns: Vec<usize>,
}

impl<const PARALLEL: bool> VTab for ArrowScan<PARALLEL> {
    type BindData = Bind;
    type InitData = Position;

    fn bind(bind: &BindInfo) -> Result<Self::BindData, Box<dyn std::error::Error>> {
        let id = bind.get_parameter(0).to_uint64();
        let name = function_name(!PARALLEL);
        let batches = registry()
            .get(&id)
            .cloned()
            .ok_or_else(|| format!("{name}({id}): no batches registered under this id"))?;
        let first = batches
            .first()
            .ok_or_else(|| format!("{name}({id}): registered without a schema"))?;
        for field in first.schema().fields() {
            bind.add_result_column(field.name(), to_duckdb_logical_type_for_field(field)?);
        }
        Ok(Bind { batches })
    }

    fn init(init: &InitInfo) -> Result<Self::InitData, Box<dyn std::error::Error>> {
        // Chunks are claimed under the lock and converted outside it, so every DuckDB thread
        // can scan at once (the pipelines above a single-threaded source run on one thread).
        // The queries over a parallel scan sort, so the order threads emit chunks in is free.
        init.set_max_threads(if PARALLEL { MAX_THREADS } else { 1 });
        // Projection pushdown: only the columns the query reads are copied into DuckDB's
        // vectors (an export's computed columns read a few of a batch's many text columns).
        // This function declares no virtual columns, so every index is one of the schema's
        // (`RecordBatch::project` refuses any other).
        let columns = init
            .get_column_indices()
            .into_iter()
            .map(usize::try_from)
            .collect::<Result<Vec<usize>, _>>()?;
        Ok(Position {
            at: Mutex::new((0, 0)),
            columns,
        })
    }

    fn func(
        func: &TableFunctionInfo<Self>,
        output: &mut DataChunkHandle,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let batches = &func.get_bind_data().batches;
        let init = func.get_init_data();
        let claimed = {
            let mut pos = init
                .at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut claimed = None;
            while let Some(batch) = batches.get(pos.0) {
                if pos.1 >= batch.num_rows() {
                    *pos = (pos.0 + 1, 0);
                    continue;
                }
                let len = (batch.num_rows() - pos.1).min(CHUNK_ROWS);
                claimed = Some(batch.slice(pos.1, len));
                pos.1 += len;
                break;
            }
            claimed
        };
        match claimed {
            Some(chunk) => {
                record_batch_to_duckdb_data_chunk(&chunk.project(&init.columns)?, output)?
            }
            None => output.set_len(0),
        }
        Ok(())
    }

    fn supports_pushdown() -> bool {
        true
    }

    fn parameters() -> Option<Vec<LogicalTypeHandle>> {
        Some(vec![LogicalTypeHandle::from(LogicalTypeId::UBigint)])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{FixedSizeBinaryArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;

    use super::Registered;
    use crate::engine::{Engine, EngineConfig};
    use crate::schema::batch::uuid_field;

    fn batch(from: i64, rows: i64) -> RecordBatch {
        let ids: Vec<u8> = (from..from + rows)
            .flat_map(|i| (i as u128).to_be_bytes())
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                uuid_field("id", false),
                Field::new("n", DataType::Int64, false),
                Field::new("s", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(FixedSizeBinaryArray::new(16, ids.into(), None)),
                Arc::new(Int64Array::from_iter_values(from..from + rows)),
                Arc::new(StringArray::from_iter(
                    (from..from + rows).map(|i| (i % 3 != 0).then(|| format!("v{i}"))),
                )),
            ],
        )
        .unwrap()
    }

    #[test]
    fn threads_scanning_at_once_see_every_row_exactly_once() {
        let engine = Engine::open(&EngineConfig {
            threads: 4,
            ..EngineConfig::default()
        })
        .unwrap();
        // Many chunks, batches that do not end on a chunk boundary.
        let batches: Vec<RecordBatch> = (0..40).map(|i| batch(i * 3001, 3001)).collect();
        let n = 40 * 3001;
        let reg = Registered::new(batches);
        let sql = format!(
            "SELECT count(*), count(DISTINCT n), sum(n), count(DISTINCT id) FROM {}",
            reg.scan_sql()
        );
        let got: (i64, i64, i64, i64) = engine
            .conn
            .query_row(&sql, [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .unwrap();
        assert_eq!(got, (n, n, (0..n).sum::<i64>(), n));
        // Sorted output is in order whatever order the threads emitted chunks in.
        let ordered: Vec<i64> = engine
            .conn
            .prepare(&format!("SELECT n FROM {} ORDER BY id", reg.scan_sql()))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(ordered, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn a_query_reads_only_its_columns_in_its_own_order() {
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        let reg = Registered::in_order(vec![batch(0, 3000), batch(3000, 5)]);
        // Columns in another order than the schema's, one of them twice, one left out.
        let sql = format!(
            "SELECT s, n, n + 1 FROM {} WHERE n IN (1, 3, 3004)",
            reg.scan_sql()
        );
        let got: Vec<(Option<String>, i64, i64)> = engine
            .conn
            .prepare(&sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            got,
            vec![
                (Some("v1".into()), 1, 2),
                (None, 3, 4),
                (Some("v3004".into()), 3004, 3005)
            ]
        );
        // No column read at all: DuckDB asks for one and counts its rows.
        let count: i64 = engine
            .conn
            .query_row(
                &format!("SELECT count(*) FROM {}", reg.scan_sql()),
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(count, 3005);
    }

    #[test]
    fn batches_are_scanned_in_place_and_released_with_their_guard() {
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        // More rows than one chunk, an empty batch in the middle, a short tail.
        let reg = Registered::new(vec![batch(0, 5000), batch(5000, 0), batch(5000, 7)]);
        let sql = format!(
            "SELECT count(*), sum(n), count(s), min(typeof(id)), max(id)::VARCHAR FROM {}",
            reg.scan_sql()
        );
        let got: (i64, i64, i64, String, String) = engine
            .conn
            .query_row(&sql, [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .unwrap();
        let nulls = (0..5007).filter(|i| i % 3 == 0).count() as i64;
        assert_eq!(
            got,
            (
                5007,
                (0..5007).sum::<i64>(),
                5007 - nulls,
                "UUID".to_string(),
                "00000000-0000-0000-0000-00000000138e".to_string()
            )
        );
        drop(reg);
        let err = engine.conn.query_row(&sql, [], |_| Ok(())).unwrap_err();
        assert!(
            err.to_string().contains("no batches registered"),
            "a released id is gone: {err}"
        );
    }
}
