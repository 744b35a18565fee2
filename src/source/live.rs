//! Reading live entities for init: the row-id ranges of its readers, the snapshot they share,
//! and keyset pages of entity rows with their EAV rows, read with binary COPY
//! (docs/design.md §4.2).

use tokio_postgres::{Client, GenericClient};
use uuid::Uuid;

use super::READ_TIMEOUT as TIMEOUT;
use arrow::record_batch::RecordBatch;

use super::Connector;
use super::catalog;
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
/// adds latency. A reader's transaction spans its whole range and waits, idle, while the
/// files before its pages are written: a server-wide idle-in-transaction limit must not end it.
pub async fn tune_for_pages(client: &Client) -> Result<()> {
    timed(
        TIMEOUT,
        "tune session",
        client.batch_execute(
            "SET jit = off; SET enable_sort = off; SET max_parallel_workers_per_gather = 0; \
             SET idle_in_transaction_session_timeout = 0",
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

/// The snapshot one init reads in (docs/design.md §4.2): exported by a holder session
/// (`pg_export_snapshot`) and imported by every reader (`SET TRANSACTION SNAPSHOT`), so all
/// readers see the source at the same instant — no row read twice or missed across their
/// ranges, and a row written or deleted during the export is not seen by any of them (flush
/// brings it to the lake). The holder keeps its transaction open only until every reader has
/// imported the snapshot or given up.
#[derive(Debug)]
pub struct ExportedSnapshot {
    ticket: SnapshotTicket,
    holder: tokio::task::JoinHandle<Result<()>>,
}

/// What a reader needs to import an [`ExportedSnapshot`]; dropping it tells the holder this
/// reader is done importing.
#[derive(Debug, Clone)]
pub struct SnapshotTicket {
    id: String,
    _imported: tokio::sync::mpsc::Sender<()>,
}

impl ExportedSnapshot {
    /// Exports a snapshot on a session of its own.
    pub async fn export(connector: &Connector) -> Result<Self> {
        Self::export_on(connector.connect().await?).await
    }

    /// Exports a snapshot on `client`, a session opened for it (it idles in the exporting
    /// transaction until every ticket is dropped, then ends).
    pub async fn export_on(mut client: Client) -> Result<Self> {
        let (id_tx, id_rx) = tokio::sync::oneshot::channel::<String>();
        let (imported, mut waiting) = tokio::sync::mpsc::channel::<()>(1);
        let holder = tokio::spawn(async move {
            // Idle in its transaction until the readers have imported the snapshot: a
            // server-wide idle-in-transaction limit must not end it first.
            timed(
                TIMEOUT,
                "tune snapshot holder",
                client.batch_execute("SET idle_in_transaction_session_timeout = 0"),
            )
            .await?;
            let tx = begin_snapshot(&mut client, "begin exported snapshot").await?;
            let row = timed(
                TIMEOUT,
                "export snapshot",
                tx.query_one("SELECT pg_export_snapshot()", &[]),
            )
            .await?;
            let id: String = row
                .try_get(0)
                .map_err(Error::postgres("read the exported snapshot's id"))?;
            if id_tx.send(id).is_err() {
                return Ok(());
            }
            // Every ticket dropped: each reader imported the snapshot or gave up.
            while waiting.recv().await.is_some() {}
            timed(TIMEOUT, "end exported snapshot", tx.commit()).await
        });
        match id_rx.await {
            Ok(id) => Ok(Self {
                ticket: SnapshotTicket {
                    id,
                    _imported: imported,
                },
                holder,
            }),
            Err(_) => Err(match holder.await {
                Ok(Err(e)) => e,
                _ => Error::Invariant("the snapshot holder ended without a snapshot".into()),
            }),
        }
    }

    /// A ticket for one reader.
    pub fn ticket(&self) -> SnapshotTicket {
        self.ticket.clone()
    }

    /// Waits until every reader holding a ticket has imported the snapshot (or given up), then
    /// ends the holder's transaction.
    pub async fn release(self) -> Result<()> {
        drop(self.ticket);
        self.holder.await.map_err(Error::task("snapshot holder"))?
    }
}

/// Begins a read-only repeatable-read transaction on `client` in the exported snapshot of
/// `ticket` (dropped once imported).
pub(super) async fn begin_in(
    client: &mut tokio_postgres::Client,
    ticket: SnapshotTicket,
) -> Result<tokio_postgres::Transaction<'_>> {
    let tx = begin_with(client, &ticket.id).await?;
    drop(ticket);
    Ok(tx)
}

/// Begins a read-only repeatable-read transaction on `client` in the snapshot exported as
/// `id` (by a transaction that stays open until this one has begun).
pub(super) async fn begin_with<'a>(
    client: &'a mut tokio_postgres::Client,
    id: &str,
) -> Result<tokio_postgres::Transaction<'a>> {
    // A snapshot id is hex digits and dashes (`00000003-0000001B-1`); anything else is refused
    // rather than put into SQL text.
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(Error::Invariant(format!(
            "unexpected exported snapshot id {id:?}"
        )));
    }
    let tx = begin_snapshot(client, "begin reader snapshot").await?;
    timed(
        TIMEOUT,
        "import the exported snapshot",
        tx.batch_execute(&format!("SET TRANSACTION SNAPSHOT '{id}'")),
    )
    .await?;
    Ok(tx)
}

/// Reads the live entities of `range` (with their EAV rows) in keyset pages, all inside ONE
/// transaction in the exported snapshot of `ticket`, and hands each page to `on_page`, which
/// returns `false` to stop. With every page in the same snapshot, a row deleted between two
/// pages cannot shift the cursor past live rows (docs/hazards.md #462: moot here), and the
/// readers' pages together are one consistent state.
#[allow(clippy::too_many_arguments)]
pub async fn read_range<F, Fut>(
    conn: &mut TappedClient,
    ticket: SnapshotTicket,
    tables: &Tables,
    schema: &SchemaDef,
    schema_id: i16,
    range: IdRange,
    limit: i64,
    mut on_page: F,
) -> Result<()>
where
    F: FnMut(LivePage) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let TappedClient { client, tap } = conn;
    let tx = begin_in(client, ticket).await?;
    let eav = eav_select(&tx, tables, schema).await?;
    let mut after = None;
    while let Some(page) = read_page_in(
        &tx, tap, tables, schema, &eav, schema_id, range, after, limit,
    )
    .await?
    {
        after = Some(page.last);
        if !on_page(page).await {
            return Ok(());
        }
    }
    timed(TIMEOUT, "end reader snapshot", tx.commit()).await
}

/// Reads up to `limit` live entities (`ltbase_deleted_at IS NULL`) of `range` with
/// `ltbase_row_id > after`, in row-id order — keyset paging, never OFFSET (docs/hazards.md #462) —
/// and their EAV rows, in the transaction `tx`. `None` when no row is left.
#[allow(clippy::too_many_arguments)]
async fn read_page_in(
    tx: &tokio_postgres::Transaction<'_>,
    tap: &super::copy_tap::CopyTap,
    tables: &Tables,
    schema: &SchemaDef,
    eav_select: &str,
    schema_id: i16,
    range: IdRange,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Option<LivePage>> {
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
    let (entities, rows) = copy_into(tx, tap, "read entity page", &sql, entities).await?;
    if rows == 0 {
        return Ok(None);
    }
    let entities = entities.finish()?;
    let (first, last) = (row_id_at(&entities, 0)?, row_id_at(&entities, rows - 1)?);
    let mut eav = BatchBuilder::eav(rows * 4);
    if schema.has_eav() {
        // Every EAV row of the page's range: the pivot picks the schema's attributes by id.
        let sql = format!(
            "{eav_select} WHERE schema_id = {schema_id} AND row_id >= '{first}'::uuid AND row_id <= '{last}'::uuid"
        );
        eav = copy_into(tx, tap, "read eav page", &sql, eav).await?.0;
    }
    Ok(Some(LivePage {
        rows,
        entities,
        eav: eav.finish()?,
        first,
        last,
    }))
}

/// The EAV read's select list (the columns of [`BatchBuilder::eav`]) on the database of
/// `client`. Only list attributes use the indices: without them NULL is read, which costs
/// PostgreSQL no send call per row. With them the empty index (every scalar's row and the
/// empty-list marker) is read as NULL too: the column is part of the primary key, so NULL
/// stands for nothing else, and the export reads NULL as the empty index. A `value_numeric`
/// of type `numeric` (docs/design.md §2.1 allows it beside the `double precision` init-db makes) is read as its nearest double, where
/// the plain cast would fail on a value beyond a double's range, and with it every read of the
/// schema until the row changes; a `double precision` one is read as it is.
pub(super) async fn eav_select(
    client: &impl GenericClient,
    tables: &Tables,
    schema: &SchemaDef,
) -> Result<String> {
    let indices = if schema.has_eav_list() {
        "NULLIF(array_indices, '')"
    } else {
        "NULL::text"
    };
    let is_numeric = catalog::column_has_type(client, &tables.eav, "value_numeric", "numeric");
    let numeric = match is_numeric.await? {
        true => super::table_rows::numeric_as_double("value_numeric"),
        false => "value_numeric::float8".to_string(),
    };
    Ok(format!(
        "SELECT row_id, attr_id, {indices}, value_text, {numeric} FROM {}",
        tables.eav.quoted()
    ))
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

/// Counts the live entities of a schema in each of `ranges` (as [`live_ranges`] cuts them:
/// consecutive, the first from the smallest id, the last unbounded), in one scan.
pub async fn count_live_in(
    client: &Client,
    tables: &Tables,
    schema_id: i16,
    ranges: &[IdRange],
) -> Result<Vec<i64>> {
    let cuts: Vec<Uuid> = ranges.iter().filter_map(|r| r.hi).collect();
    // Rows below each cut, then all of them: a range's rows are the difference.
    let below: String = (0..cuts.len())
        .map(|i| {
            format!(
                "count(*) FILTER (WHERE ltbase_row_id < ($2::uuid[])[{}]), ",
                i + 1
            )
        })
        .collect();
    let sql = format!(
        "SELECT {below}count(*) FROM {} WHERE ltbase_schema_id = $1 AND ltbase_deleted_at IS NULL",
        tables.entity.quoted()
    );
    let row = timed(
        TIMEOUT,
        "count live entities per range",
        client.query_one(&sql, &[&schema_id, &cuts]),
    )
    .await?;
    let mut counts = Vec::with_capacity(ranges.len());
    let mut before = 0i64;
    for i in 0..=cuts.len() {
        let upto: i64 = row
            .try_get(i)
            .map_err(Error::postgres("read live counts per range"))?;
        counts.push(upto - before);
        before = upto;
    }
    Ok(counts)
}

/// Estimates the live entities of a schema from the planner's statistics, reading no rows:
/// enough for a progress total and for sizing the last files, where an exact count would scan
/// the table once more, competing with the export for the server's CPU.
pub async fn estimate_live(
    client: &impl tokio_postgres::GenericClient,
    tables: &Tables,
    schema_id: i16,
) -> Result<i64> {
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
