//! What `verify --source` compares the lake with (docs/design.md §10): the dirty row ids of a
//! schema and its live rows' versions (`ltbase_updated_at`), in `row_id` order, read with
//! binary COPY in keyset pages inside an exported snapshot, so the dirty ids and every page
//! are one consistent state of the source.

use arrow::array::{Array, AsArray, FixedSizeBinaryArray};
use arrow::datatypes::Int64Type;
use arrow::record_batch::RecordBatch;

use super::connect::TappedClient;
use super::decoding::copy_into;
use super::live::{SnapshotTicket, begin_in};
use super::rows::BatchBuilder;
use super::{READ_TIMEOUT as TIMEOUT, connect::timed};
use crate::config::Tables;
use crate::error::{Error, Result};
use crate::schema::SlotType;

/// A row id as a big-endian number (UUID byte order, PostgreSQL's `uuid` order).
pub type RowId = u128;

fn ids_of(batch: &RecordBatch) -> Result<&FixedSizeBinaryArray> {
    batch
        .column(0)
        .as_any()
        .downcast_ref::<FixedSizeBinaryArray>()
        .ok_or_else(|| Error::Invariant("row id column is not 16-byte binary".into()))
}

fn row_id(ids: &FixedSizeBinaryArray, i: usize) -> Result<RowId> {
    let bytes: [u8; 16] = ids
        .value(i)
        .try_into()
        .map_err(|_| Error::Invariant("row id is not 16 bytes".into()))?;
    Ok(u128::from_be_bytes(bytes))
}

/// The schema's dirty `change_log` slots (`flushed_at = 0`) as `(row_id, changed_at)`, sorted
/// by row id, read in the snapshot of `ticket`.
pub async fn dirty_ids(
    conn: &mut TappedClient,
    ticket: SnapshotTicket,
    tables: &Tables,
    schema_id: i16,
) -> Result<Vec<(RowId, i64)>> {
    let TappedClient { client, tap } = conn;
    let tx = begin_in(client, ticket).await?;
    let out = read_dirty(&tx, tap, tables, schema_id).await?;
    timed(TIMEOUT, "end dirty id read", tx.commit()).await?;
    Ok(out)
}

async fn read_dirty(
    tx: &tokio_postgres::Transaction<'_>,
    tap: &super::copy_tap::CopyTap,
    tables: &Tables,
    schema_id: i16,
) -> Result<Vec<(RowId, i64)>> {
    let sql = format!(
        "SELECT row_id, changed_at FROM {} WHERE schema_id = {schema_id} AND flushed_at = 0 ORDER BY row_id",
        tables.change_log.quoted()
    );
    let columns = [
        ("row_id", SlotType::Uuid, false),
        ("changed_at", SlotType::Bigint, false),
    ];
    let into = BatchBuilder::new(&columns, 1024);
    let (into, rows) = copy_into(tx, tap, "read dirty row ids", &sql, into).await?;
    pairs(&into.finish()?, rows)
}

/// A chunk of live versions handed over by [`live_versions`].
#[derive(Debug)]
pub struct Chunk {
    /// `(row_id, ltbase_updated_at)` rows.
    pub rows: Vec<(RowId, i64)>,
    /// The rows are in `row_id` order and follow the previous chunk's (index order); else
    /// they are in heap order and only the whole read is complete (sort and merge them).
    pub sorted: bool,
}

/// In one repeatable-read transaction: the schema's dirty row ids ([`dirty_ids`]), handed to
/// `on_dirty`, then `(row_id, ltbase_updated_at)` of its live entities (`ltbase_deleted_at IS
/// NULL`), each chunk handed to `on_chunk` (which returns `false` to stop). When the schema
/// holds most of the entity table, the table is read in physical order, by ranges of heap
/// pages (TID range scans: sequential reads whatever the id order, where index order reads a
/// table of random ids at random), in chunks that are not sorted; otherwise the schema's rows
/// are read in `row_id` order by keyset pages of `page_rows` on the primary key. A heap chunk
/// aims at a page's rows; `readers` connections read the heap chunks at once, in this
/// transaction's snapshot. Returns whether the table was read in heap order.
#[allow(clippy::too_many_arguments)]
pub async fn live_versions<F, Fut>(
    connector: &super::Connector,
    conn: &mut TappedClient,
    tables: &Tables,
    schema_id: i16,
    page_rows: usize,
    readers: usize,
    on_dirty: impl FnOnce(Vec<(RowId, i64)>),
    mut on_chunk: F,
) -> Result<bool>
where
    F: FnMut(Chunk) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    // The other readers' connections are opened meanwhile (dropped unused in index order).
    let spares: Vec<tokio::task::JoinHandle<Result<TappedClient>>> = (1..readers.max(1))
        .map(|_| {
            let connector = connector.clone();
            tokio::spawn(async move {
                let conn = connector.connect_tapped().await?;
                super::live::tune_for_pages(&conn.client).await?;
                Ok(conn)
            })
        })
        .collect();
    super::live::tune_for_pages(&conn.client).await?;
    let TappedClient { client, tap } = conn;
    let tx = super::decoding::begin_snapshot(client, "begin version read").await?;
    on_dirty(read_dirty(&tx, tap, tables, schema_id).await?);
    let t = tables.entity.quoted();
    // The table's size, read inside the snapshot: every row it can see lies on a page that
    // existed when it was taken (and the last range is open-ended anyway).
    let sizes = format!(
        "SELECT (pg_relation_size('{t}'::regclass) / current_setting('block_size')::int)::int8,                 GREATEST(c.reltuples, 0)::float8 FROM pg_class c WHERE c.oid = '{t}'::regclass"
    );
    let row = timed(
        TIMEOUT,
        "read the entity table's size",
        tx.query_one(&sizes, &[]),
    )
    .await?;
    let (pages, mut tuples): (i64, f64) = (row.get(0), row.get(1));
    if pages > 0 && tuples <= 0.0 {
        // Never analysed (docs/design.md §4.2, "Without statistics"): counted from a sample.
        tuples = super::heap_read::sample_count(&tx, &t, pages).await?;
    }
    let estimate = super::live::estimate_live(&tx, tables, schema_id).await? as f64;
    let heap = pages > 0 && tuples > 0.0 && estimate >= tuples * 0.25;
    let columns = [
        ("row_id", SlotType::Uuid, false),
        ("updated_at", SlotType::Bigint, false),
    ];
    let filter = format!("ltbase_schema_id = {schema_id} AND ltbase_deleted_at IS NULL");
    if heap {
        // Ranges of heap pages holding about `page_rows` rows each, read by `readers`
        // connections at once (the others import this transaction's snapshot), each taking
        // every `readers`-th range.
        let ranges = super::heap_read::page_ranges(pages, tuples, page_rows as f64);
        let sql = |range: &String| {
            format!("SELECT ltbase_row_id, ltbase_updated_at FROM {t} WHERE {filter} AND {range}")
        };
        let readers = readers.clamp(1, ranges.len());
        let snapshot: Option<String> = if readers > 1 {
            let row = timed(
                TIMEOUT,
                "export the read's snapshot",
                tx.query_one("SELECT pg_export_snapshot()", &[]),
            )
            .await?;
            Some(row.get(0))
        } else {
            None
        };
        let (chunk_tx, mut chunk_rx) = tokio::sync::mpsc::channel::<Vec<(RowId, i64)>>(readers);
        let mine: Vec<String> = ranges.iter().step_by(readers).map(sql).collect();
        let first = read_ranges(&tx, tap, mine, chunk_tx.clone());
        let others =
            futures::future::try_join_all(spares.into_iter().zip(1..readers).map(|(spare, k)| {
                let queries: Vec<String> =
                    ranges.iter().skip(k).step_by(readers).map(sql).collect();
                let (chunk_tx, snapshot) = (chunk_tx.clone(), snapshot.clone());
                async move {
                    let mut conn = spare.await.map_err(Error::task("connect a reader"))??;
                    let TappedClient { client, tap } = &mut conn;
                    let tx =
                        super::live::begin_with(client, snapshot.as_deref().unwrap_or("")).await?;
                    read_ranges(&tx, tap, queries, chunk_tx).await?;
                    timed(TIMEOUT, "end live version read", tx.commit()).await
                }
            }));
        drop(chunk_tx);
        let deliver = async {
            while let Some(rows) = chunk_rx.recv().await {
                if !on_chunk(Chunk {
                    rows,
                    sorted: false,
                })
                .await
                {
                    return;
                }
            }
        };
        let (first, others, ()) = tokio::join!(first, others, deliver);
        first?;
        others?;
    } else {
        let mut after: Option<uuid::Uuid> = None;
        loop {
            let bound =
                after.map_or_else(String::new, |a| format!(" AND ltbase_row_id > '{a}'::uuid"));
            let sql = format!(
                "SELECT ltbase_row_id, ltbase_updated_at FROM {t} WHERE {filter}{bound}                  ORDER BY ltbase_row_id LIMIT {page_rows}"
            );
            let into = BatchBuilder::new(&columns, page_rows);
            let (into, rows) = copy_into(&tx, tap, "read live versions", &sql, into).await?;
            if rows == 0 {
                break;
            }
            let page = pairs(&into.finish()?, rows)?;
            after = page.last().map(|(id, _)| uuid::Uuid::from_u128(*id));
            let full = rows >= page_rows;
            if !on_chunk(Chunk {
                rows: page,
                sorted: true,
            })
            .await
                || !full
            {
                break;
            }
        }
    }
    timed(TIMEOUT, "end live version read", tx.commit()).await?;
    Ok(heap)
}

/// Runs each of `queries` (binary COPY of `(row_id, version)`) in `tx`, sending its rows to
/// `out`; stops quietly when `out` is closed.
async fn read_ranges(
    tx: &tokio_postgres::Transaction<'_>,
    tap: &super::copy_tap::CopyTap,
    queries: Vec<String>,
    out: tokio::sync::mpsc::Sender<Vec<(RowId, i64)>>,
) -> Result<()> {
    let columns = [
        ("row_id", SlotType::Uuid, false),
        ("updated_at", SlotType::Bigint, false),
    ];
    for sql in queries {
        let into = BatchBuilder::new(&columns, 1024);
        let (into, rows) = copy_into(tx, tap, "read live versions", &sql, into).await?;
        if out.send(pairs(&into.finish()?, rows)?).await.is_err() {
            break;
        }
    }
    Ok(())
}

/// The `(row_id, version)` pairs of a two-column batch of `rows` rows.
fn pairs(batch: &RecordBatch, rows: usize) -> Result<Vec<(RowId, i64)>> {
    let ids = ids_of(batch)?;
    let versions = batch
        .column(1)
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| Error::Invariant("version column is not bigint".into()))?;
    (0..rows)
        .map(|i| Ok((row_id(ids, i)?, versions.value(i))))
        .collect()
}

/// Which of `ids` are dirty in the schema's `change_log` (in chunks of 10,000 ids).
pub async fn dirty_among(
    client: &tokio_postgres::Client,
    tables: &Tables,
    schema_id: i16,
    ids: &[uuid::Uuid],
) -> Result<std::collections::BTreeSet<RowId>> {
    let sql = format!(
        "SELECT row_id FROM {} WHERE schema_id = $1 AND flushed_at = 0 AND row_id = ANY($2)",
        tables.change_log.quoted()
    );
    ids_among(client, &sql, "read dirty row ids", schema_id, ids).await
}

/// The row ids `sql` (`$1` the schema id, `$2` a chunk of `ids`) returns, asked in chunks of
/// 10,000 ids.
async fn ids_among(
    client: &tokio_postgres::Client,
    sql: &str,
    op: &'static str,
    schema_id: i16,
    ids: &[uuid::Uuid],
) -> Result<std::collections::BTreeSet<RowId>> {
    let mut out = std::collections::BTreeSet::new();
    for chunk in ids.chunks(10_000) {
        let rows = timed(TIMEOUT, op, client.query(sql, &[&schema_id, &chunk])).await?;
        for r in &rows {
            let id: uuid::Uuid = r.try_get(0).map_err(crate::error::Error::postgres(op))?;
            out.insert(id.as_u128());
        }
    }
    Ok(out)
}

/// The ids among `ids` that schema `schema_id` holds live right now (an entity row not
/// soft-deleted). gc's settling asks it about rows the lake no longer holds (docs/design.md
/// §4.4).
pub async fn live_among(
    client: &tokio_postgres::Client,
    tables: &Tables,
    schema_id: i16,
    ids: &[uuid::Uuid],
) -> Result<std::collections::BTreeSet<RowId>> {
    let sql = format!(
        "SELECT ltbase_row_id FROM {} WHERE ltbase_schema_id = $1 AND ltbase_row_id = ANY($2) \
         AND ltbase_deleted_at IS NULL",
        tables.entity.quoted()
    );
    ids_among(client, &sql, "read live row ids", schema_id, ids).await
}
