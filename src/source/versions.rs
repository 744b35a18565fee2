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

/// The row ids of the schema's dirty `change_log` slots (`flushed_at = 0`), sorted, read in
/// the snapshot of `ticket`.
pub async fn dirty_ids(
    conn: &mut TappedClient,
    ticket: SnapshotTicket,
    tables: &Tables,
    schema_id: i16,
) -> Result<Vec<RowId>> {
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
) -> Result<Vec<RowId>> {
    let sql = format!(
        "SELECT row_id FROM {} WHERE schema_id = {schema_id} AND flushed_at = 0 ORDER BY row_id",
        tables.change_log.quoted()
    );
    let into = BatchBuilder::new(&[("row_id", SlotType::Uuid, false)], 1024);
    let (into, rows) = copy_into(tx, tap, "read dirty row ids", &sql, into).await?;
    let batch = into.finish()?;
    let ids = ids_of(&batch)?;
    (0..rows).map(|i| row_id(ids, i)).collect()
}

/// In one repeatable-read transaction: the schema's dirty row ids ([`dirty_ids`]), handed to
/// `on_dirty`, then `(row_id, ltbase_updated_at)` of its live entities (`ltbase_deleted_at IS
/// NULL`) in `row_id` order, in keyset pages of `page_rows`, each handed to `on_page` (which
/// returns `false` to stop).
pub async fn live_versions<F, Fut>(
    conn: &mut TappedClient,
    tables: &Tables,
    schema_id: i16,
    page_rows: usize,
    on_dirty: impl FnOnce(Vec<RowId>),
    mut on_page: F,
) -> Result<()>
where
    F: FnMut(Vec<(RowId, i64)>) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    super::live::tune_for_pages(&conn.client).await?;
    let TappedClient { client, tap } = conn;
    let tx = super::decoding::begin_snapshot(client, "begin version read").await?;
    on_dirty(read_dirty(&tx, tap, tables, schema_id).await?);
    let mut after: Option<uuid::Uuid> = None;
    loop {
        let bound = after.map_or_else(String::new, |a| format!(" AND ltbase_row_id > '{a}'::uuid"));
        let sql = format!(
            "SELECT ltbase_row_id, ltbase_updated_at FROM {} WHERE ltbase_schema_id = {schema_id} \
             AND ltbase_deleted_at IS NULL{bound} ORDER BY ltbase_row_id LIMIT {page_rows}",
            tables.entity.quoted()
        );
        let into = BatchBuilder::new(
            &[
                ("row_id", SlotType::Uuid, false),
                ("updated_at", SlotType::Bigint, false),
            ],
            page_rows,
        );
        let (into, rows) = copy_into(&tx, tap, "read live versions", &sql, into).await?;
        if rows == 0 {
            break;
        }
        let batch = into.finish()?;
        let ids = ids_of(&batch)?;
        let versions = batch
            .column(1)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| Error::Invariant("version column is not bigint".into()))?;
        let mut page = Vec::with_capacity(rows);
        for i in 0..rows {
            page.push((row_id(ids, i)?, versions.value(i)));
        }
        after = page.last().map(|(id, _)| uuid::Uuid::from_u128(*id));
        let full = rows >= page_rows;
        if !on_page(page).await || !full {
            break;
        }
    }
    timed(TIMEOUT, "end live version read", tx.commit()).await
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
    let mut out = std::collections::BTreeSet::new();
    for chunk in ids.chunks(10_000) {
        let rows = timed(
            TIMEOUT,
            "read dirty row ids",
            client.query(&sql, &[&schema_id, &chunk]),
        )
        .await?;
        out.extend(rows.iter().map(|r| r.get::<_, uuid::Uuid>(0).as_u128()));
    }
    Ok(out)
}
