//! Reading live entities for init: the row-id ranges of its readers, and keyset pages of
//! entity rows with their EAV rows, each page in one repeatable-read snapshot, read with binary
//! COPY (docs/design.md §4.2).

use tokio_postgres::Client;
use uuid::Uuid;

use super::READ_TIMEOUT as TIMEOUT;
use arrow::record_batch::RecordBatch;

use super::connect::{TappedClient, timed};
use super::decoding::begin_snapshot;
use super::decoding::copy_into;
use super::rows::{BatchBuilder, bound_columns, row_id_at};
use crate::config::Tables;
use crate::error::{Error, Result};
use crate::schema::SchemaDef;

/// Tunes a connection that reads init's keyset pages. A page reads its rows in row-id order
/// with a LIMIT; near the end of a range the planner estimates fewer rows than the LIMIT and
/// switches to a parallel bitmap scan with a sort, which measured eight times slower than the
/// index scan and starts worker processes that compete with the other readers for the same
/// cores. Neither page statement needs a sort or parallel workers, and JIT compilation only
/// adds latency.
pub async fn tune_for_pages(client: &Client) -> Result<()> {
    timed(
        TIMEOUT,
        "tune session",
        client.batch_execute(
            "SET jit = off; SET enable_sort = off; SET max_parallel_workers_per_gather = 0",
        ),
    )
    .await
}

/// One keyset page of live entities for a base export.
#[derive(Debug, Clone)]
pub struct LivePage {
    /// Entity rows (see [`Snapshot::entities`]), ordered by `ltbase_row_id`.
    pub entities: RecordBatch,
    /// Their EAV rows.
    pub eav: RecordBatch,
    /// First row id of the page.
    pub first: Uuid,
    /// Last row id of the page (the next page's cursor).
    pub last: Uuid,
    /// Rows in the page.
    pub rows: usize,
}

/// A slice of the row-id space read by one init reader: `lo <= ltbase_row_id < hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// Inclusive lower bound.
    pub lo: Uuid,
    /// Exclusive upper bound; `None` is unbounded.
    pub hi: Option<Uuid>,
}

/// Splits the row-id space into `parts` ranges cut at equal widths between the smallest and
/// largest live id (UUIDv7 ids are time-ordered, so equal widths hold similar row counts); the
/// ranges together cover every possible id. Empty when the schema has no live row.
pub async fn live_ranges(
    client: &Client,
    tables: &Tables,
    schema_id: i16,
    parts: u32,
) -> Result<Vec<IdRange>> {
    // PostgreSQL has no min/max for uuid; two index probes give the bounds.
    let t = tables.entity.quoted();
    let sql = format!(
        "SELECT (SELECT ltbase_row_id FROM {t} WHERE ltbase_schema_id = $1 AND ltbase_deleted_at IS NULL \
                 ORDER BY ltbase_row_id LIMIT 1), \
                (SELECT ltbase_row_id FROM {t} WHERE ltbase_schema_id = $1 AND ltbase_deleted_at IS NULL \
                 ORDER BY ltbase_row_id DESC LIMIT 1)"
    );
    let row = timed(
        TIMEOUT,
        "read row id bounds",
        client.query_one(&sql, &[&schema_id]),
    )
    .await?;
    let (Some(min), Some(max)) = (row.get::<_, Option<Uuid>>(0), row.get::<_, Option<Uuid>>(1))
    else {
        return Ok(Vec::new());
    };
    let (lo, hi) = (min.as_u128(), max.as_u128());
    let parts = u128::from(parts.max(1));
    let width = (hi - lo) / parts;
    let mut cuts: Vec<u128> = (1..parts).map(|i| lo + width * i).collect();
    cuts.dedup();
    cuts.retain(|c| *c > lo);
    let mut ranges = Vec::new();
    // The first range starts at the smallest possible id, so a row inserted meanwhile below
    // the minimum is not skipped (the last range is unbounded above for the same reason).
    let mut start = 0;
    for c in cuts {
        ranges.push(IdRange {
            lo: Uuid::from_u128(start),
            hi: Some(Uuid::from_u128(c)),
        });
        start = c;
    }
    ranges.push(IdRange {
        lo: Uuid::from_u128(start),
        hi: None,
    });
    Ok(ranges)
}

/// Reads up to `limit` live entities (`ltbase_deleted_at IS NULL`) of `range` with
/// `ltbase_row_id > after`, in row-id order — keyset paging, never OFFSET (docs/hazards.md #462) —
/// and their EAV rows, in one repeatable-read snapshot. `None` when no row is left.
pub async fn read_live_page(
    conn: &mut TappedClient,
    tables: &Tables,
    schema: &SchemaDef,
    schema_id: i16,
    range: IdRange,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Option<LivePage>> {
    let tap = &conn.tap;
    let tx = begin_snapshot(&mut conn.client, "begin page snapshot").await?;
    let bound = bound_columns(schema);
    let select_cols: String = bound.iter().map(|(c, _)| format!(", {c}")).collect();
    // Read with binary COPY (decoded without row objects). COPY takes no parameters: the only
    // values in the text are the schema id and row ids, formatted here from their types.
    let mut bounds = format!("ltbase_row_id >= '{}'::uuid", range.lo);
    if let Some(hi) = range.hi {
        bounds.push_str(&format!(" AND ltbase_row_id < '{hi}'::uuid"));
    }
    if let Some(after) = after {
        bounds.push_str(&format!(" AND ltbase_row_id > '{after}'::uuid"));
    }
    let sql = format!(
        "SELECT ltbase_row_id, ltbase_created_at, ltbase_updated_at, ltbase_deleted_at{select_cols} \
         FROM {} WHERE ltbase_schema_id = {schema_id} AND ltbase_deleted_at IS NULL AND {bounds} \
         ORDER BY ltbase_row_id LIMIT {limit}",
        tables.entity.quoted()
    );
    let entities = BatchBuilder::entities(&bound, usize::try_from(limit).unwrap_or(0));
    let (entities, rows) = copy_into(&tx, tap, "read entity page", &sql, entities).await?;
    if rows == 0 {
        timed(TIMEOUT, "end page snapshot", tx.commit()).await?;
        return Ok(None);
    }
    let entities = entities.finish()?;
    let (first, last) = (row_id_at(&entities, 0)?, row_id_at(&entities, rows - 1)?);
    let mut eav = BatchBuilder::eav(rows * 4);
    if schema.has_eav() {
        // Every EAV row of the page's range: the pivot picks the schema's attributes by id.
        let sql = format!(
            "{} WHERE schema_id = {schema_id} AND row_id >= '{first}'::uuid AND row_id <= '{last}'::uuid",
            eav_select(tables, schema)
        );
        eav = copy_into(&tx, tap, "read eav page", &sql, eav).await?.0;
    }
    timed(TIMEOUT, "end page snapshot", tx.commit()).await?;
    Ok(Some(LivePage {
        rows,
        entities,
        eav: eav.finish()?,
        first,
        last,
    }))
}

/// The EAV read's select list (the columns of [`BatchBuilder::eav`]). Only list attributes use
/// the indices: without them NULL is read, which costs PostgreSQL no send call per row.
pub(super) fn eav_select(tables: &Tables, schema: &SchemaDef) -> String {
    let indices = if schema.has_eav_list() {
        "array_indices"
    } else {
        "NULL::text"
    };
    format!(
        "SELECT row_id, attr_id, {indices}, value_text, value_numeric::float8 FROM {}",
        tables.eav.quoted()
    )
}

/// A page with no rows but the schema's columns (for a zero-row base).
pub fn empty_live_page(schema: &SchemaDef) -> Result<LivePage> {
    Ok(LivePage {
        entities: BatchBuilder::entities(&bound_columns(schema), 0).finish()?,
        eav: BatchBuilder::eav(0).finish()?,
        first: Uuid::nil(),
        last: Uuid::nil(),
        rows: 0,
    })
}

/// Counts the live entities of a schema.
pub async fn count_live(client: &Client, tables: &Tables, schema_id: i16) -> Result<i64> {
    let sql = format!(
        "SELECT count(*) FROM {} WHERE ltbase_schema_id = $1 AND ltbase_deleted_at IS NULL",
        tables.entity.quoted()
    );
    Ok(timed(
        TIMEOUT,
        "count live entities",
        client.query_one(&sql, &[&schema_id]),
    )
    .await?
    .get(0))
}

/// Estimates the live entities of a schema from the planner's statistics, reading no rows:
/// enough for a progress total and for sizing the last files, where an exact count would scan
/// the table once more, competing with the export for the server's CPU.
pub async fn estimate_live(client: &Client, tables: &Tables, schema_id: i16) -> Result<i64> {
    let sql = format!(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {} WHERE ltbase_schema_id = $1 AND ltbase_deleted_at IS NULL",
        tables.entity.quoted()
    );
    let row = timed(
        TIMEOUT,
        "estimate live entities",
        client.query_one(&sql, &[&schema_id]),
    )
    .await?;
    let plan: serde_json::Value = row
        .try_get(0)
        .map_err(Error::postgres("read the live-row estimate"))?;
    let rows = plan[0]["Plan"]["Plan Rows"].as_f64().ok_or_else(|| {
        Error::decode(
            "live-row estimate",
            format!("no \"Plan Rows\" in its plan: {plan}"),
        )
    })?;
    Ok(rows.max(0.0).round() as i64)
}
