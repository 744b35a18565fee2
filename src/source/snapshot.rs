//! Reading one flush batch: the selection of dirty slots, and their payload — the slots
//! themselves, their `entity_main` rows and their EAV rows — read in ONE `REPEATABLE READ READ
//! ONLY` transaction so that every table is seen at the same instant (no payload skew, study
//! §10 #45). Values travel as parameters (`= ANY($n)`), never as SQL text; results come back in
//! binary form and leave this module as Arrow batches. Also the mark step: `flushed_at = T`
//! only where `changed_at` still equals the exported version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::{
    ArrayRef, BinaryBuilder, FixedSizeBinaryArray, FixedSizeBinaryBuilder, Float64Builder,
    Int16Builder, Int32Builder, Int64Builder, StringArray,
};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use bytes::{Buf, BufMut};
use futures::TryStreamExt;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, GenericClient, IsolationLevel, Row, Statement, Transaction};
use uuid::Uuid;

use super::connect::{TappedClient, timed, within};
use super::copy_tap::{self, CopySink, CopyTap, Divert, SharedSink};
use crate::config::Tables;
use crate::error::{Error, Result};
use crate::schema::{SchemaDef, SlotType};

const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// A dirty slot chosen for a batch: its row and the version it carried when selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selected {
    /// The row.
    pub row_id: Uuid,
    /// Its dirty version.
    pub changed_at: i64,
    /// Where the slot's tuple was when selected, so the mark reaches it without an index
    /// lookup.
    pub tid: Tid,
}

/// A tuple's physical address (`ctid`). The mark uses it only to find a slot quickly and still
/// checks `row_id`, `changed_at` and `flushed_at`: a slot whose tuple moved since the selection
/// (an update, `VACUUM FULL`) is not marked and stays dirty — the safe side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tid {
    block: u32,
    offset: u16,
}

/// A value's bytes in PostgreSQL's binary format, decoded by [`Column::push_binary`].
struct Raw<'a>(&'a [u8]);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(raw))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

impl<'a> FromSql<'a> for Tid {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        match raw {
            [b0, b1, b2, b3, o0, o1] => Ok(Self {
                block: u32::from_be_bytes([*b0, *b1, *b2, *b3]),
                offset: u16::from_be_bytes([*o0, *o1]),
            }),
            _ => Err(format!("a tid is 6 bytes, got {}", raw.len()).into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TID
    }
}

impl ToSql for Tid {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.put_u32(self.block);
        out.put_u16(self.offset);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TID
    }

    to_sql_checked!();
}

/// The payload of one batch, as Arrow batches for the engine.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `row_id UUID, changed_at BIGINT, deleted_at BIGINT` — the slots exported.
    pub change_log: RecordBatch,
    /// `ltbase_row_id UUID, ltbase_created_at, ltbase_updated_at, ltbase_deleted_at BIGINT`,
    /// then the schema's bound slot columns.
    pub entities: RecordBatch,
    /// `row_id UUID, attr_id SMALLINT, array_indices VARCHAR, value_text VARCHAR,
    /// value_numeric DOUBLE`.
    pub eav: RecordBatch,
    /// The version exported for each row, for the mark step.
    pub versions: Vec<Selected>,
}

/// An Arrow field holding UUIDs (16-byte fixed binary with the `arrow.uuid` extension), which
/// DuckDB reads as its UUID type.
pub fn uuid_field(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::FixedSizeBinary(16), nullable).with_metadata(HashMap::from([(
        "ARROW:extension:name".to_string(),
        "arrow.uuid".to_string(),
    )]))
}

/// Tunes a connection that reads batches by row id and marks them by `ctid`. The statements
/// look up a few thousand rows by primary key (`= ANY($n)`) or tuple address (an `unnest`
/// join on `ctid`); with arrays that large the
/// planner's estimates favour sequential or hash plans that scan whole tables and make a
/// backlog drain quadratic. Index lookups are always right here, and JIT compilation only adds
/// latency to these short statements.
pub async fn tune_for_lookups(client: &Client) -> Result<()> {
    timed(
        TIMEOUT,
        "tune session",
        client.batch_execute(
            "SET jit = off; SET enable_seqscan = off; SET enable_hashjoin = off; \
             SET enable_mergejoin = off; SET plan_cache_mode = force_generic_plan",
        ),
    )
    .await
}

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

/// The batch-read statements of one schema, prepared once per run (planned once: no
/// per-batch planning of large array parameters).
#[derive(Debug, Clone)]
pub struct BatchStatements {
    first: Statement,
    after: Statement,
    entities: Statement,
    /// The bound slot columns the entity read returns.
    bound: Vec<(String, SlotType)>,
    /// `None` when the schema has no EAV attribute.
    eav: Option<Statement>,
}

impl BatchStatements {
    /// Prepares the slot, entity and EAV reads for `schema` on `client`.
    pub async fn prepare(client: &Client, tables: &Tables, schema: &SchemaDef) -> Result<Self> {
        let cl = tables.change_log.quoted();
        let first = format!(
            "SELECT row_id, changed_at, deleted_at, ctid FROM {cl} WHERE schema_id = $1 AND flushed_at = 0 \
             ORDER BY changed_at, row_id LIMIT $2"
        );
        let after = format!(
            "SELECT row_id, changed_at, deleted_at, ctid FROM {cl} WHERE schema_id = $1 AND flushed_at = 0 \
             AND changed_at >= $3 AND (changed_at, row_id) > ($3, $4) ORDER BY changed_at, row_id LIMIT $2"
        );
        let bound = bound_columns(schema);
        let select_cols: String = bound.iter().map(|(c, _)| format!(", {c}")).collect();
        let entities = format!(
            "SELECT ltbase_row_id, ltbase_created_at, ltbase_updated_at, ltbase_deleted_at{select_cols} \
             FROM {} WHERE ltbase_schema_id = $1 AND ltbase_row_id = ANY($2)",
            tables.entity.quoted()
        );
        // Every EAV row of the batch's entities: the pivot picks the schema's attributes by id
        // and ignores others. An `attr_id = ANY(..)` condition here would make the index scan
        // descend once per (row, attribute) pair — three times the work for three attributes.
        let eav = format!(
            "{} WHERE schema_id = $1 AND row_id = ANY($2)",
            eav_select(tables, schema)
        );
        Ok(Self {
            first: timed(TIMEOUT, "prepare change_log read", client.prepare(&first)).await?,
            after: timed(TIMEOUT, "prepare change_log read", client.prepare(&after)).await?,
            entities: timed(
                TIMEOUT,
                "prepare entity_main read",
                client.prepare(&entities),
            )
            .await?,
            bound,
            eav: if schema.has_eav() {
                Some(timed(TIMEOUT, "prepare eav_data read", client.prepare(&eav)).await?)
            } else {
                None
            },
        })
    }
}

/// Selects up to `limit` dirty slots ordered by `(changed_at, row_id)`, strictly after `after`
/// when given (keyset paging, so a run never revisits a slot it has planned). The dry run's
/// selection; a real batch selects inside its snapshot ([`read_next`]).
pub async fn select(
    client: &Client,
    stmts: &BatchStatements,
    schema_id: i16,
    limit: i64,
    after: Option<Selected>,
) -> Result<Vec<Selected>> {
    let slots = select_slots(client, stmts, schema_id, limit, after).await?;
    Ok(selected(&slots))
}

/// The slot rows (`row_id, changed_at, deleted_at, ctid`) of the next selection.
async fn select_slots(
    client: &impl GenericClient,
    stmts: &BatchStatements,
    schema_id: i16,
    limit: i64,
    after: Option<Selected>,
) -> Result<Vec<Row>> {
    timed(TIMEOUT, "select batch", async {
        match after {
            None => client.query(&stmts.first, &[&schema_id, &limit]).await,
            Some(a) => {
                let params: [&(dyn ToSql + Sync); 4] =
                    [&schema_id, &limit, &a.changed_at, &a.row_id];
                client.query(&stmts.after, &params).await
            }
        }
    })
    .await
}

fn selected(slots: &[Row]) -> Vec<Selected> {
    slots
        .iter()
        .map(|r| Selected {
            row_id: r.get(0),
            changed_at: r.get(1),
            tid: r.get(3),
        })
        .collect()
}

/// Selects the next batch — up to `limit` dirty slots by `(changed_at, row_id)` after `after` —
/// and reads their entity and EAV rows, all in ONE repeatable-read snapshot: the payload is
/// exactly the versions selected (no skew, study §10 #45). `before_payload` runs between the
/// selection and the payload reads, with the selection (so the next batch's selection can
/// start; also a test seam). `None` when nothing is dirty after `after`.
pub async fn read_next<F: std::future::Future<Output = ()>>(
    conn: &mut TappedClient,
    stmts: &BatchStatements,
    schema_id: i16,
    limit: i64,
    after: Option<Selected>,
    before_payload: impl FnOnce(&[Selected]) -> F,
) -> Result<Option<Snapshot>> {
    let tap = &conn.tap;
    let tx = timed(
        TIMEOUT,
        "begin snapshot",
        conn.client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start(),
    )
    .await?;
    let slots = select_slots(&tx, stmts, schema_id, limit, after).await?;
    if slots.is_empty() {
        timed(TIMEOUT, "end snapshot", tx.commit()).await?;
        return Ok(None);
    }
    let selected = selected(&slots);
    before_payload(&selected).await;
    let ids: Vec<Uuid> = selected.iter().map(|s| s.row_id).collect();
    let entities = Decoding::shared(
        "read entity_main",
        CopyDecoder::data_rows(),
        BatchBuilder::entities(&stmts.bound, ids.len()),
    );
    let eav = Decoding::shared(
        "read eav_data",
        CopyDecoder::data_rows(),
        BatchBuilder::eav(ids.len() * 4),
    );
    // Both reads are sent at once: tokio-postgres pipelines them on the connection, so the
    // server works on the second while the first's rows are decoded here. `try_join!` polls
    // the entity read first, and a prepared statement's `query_raw` sends before its first
    // await, so the entity read is sent first, as the tap's sinks are listed. Each read checks
    // its row count against the server's CommandComplete, so a misrouted row fails the read.
    let mut sinks: Vec<SharedSink> = vec![entities.clone()];
    if stmts.eav.is_some() {
        sinks.push(eav.clone());
    }
    let armed = tap.arm_for(Divert::DataRows, sinks);
    let params: [&(dyn ToSql + Sync); 2] = [&schema_id, &ids];
    let entity_read = stream_into(&tx, "read entity_main", &stmts.entities, &params, &entities);
    let eav_read = async {
        match &stmts.eav {
            None => Ok(()),
            Some(stmt) => stream_into(&tx, "read eav_data", stmt, &params, &eav).await,
        }
    };
    futures::try_join!(entity_read, eav_read)?;
    drop(armed);
    timed(TIMEOUT, "end snapshot", tx.commit()).await?;
    let (entities, _) = copy_tap::lock(&entities).finish()?;
    let (eav, _) = copy_tap::lock(&eav).finish()?;
    let snapshot = Snapshot {
        versions: selected,
        change_log: change_log_batch(&slots)?,
        entities: entities.finish()?,
        eav: eav.finish()?,
    };
    Ok(Some(snapshot))
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
/// `ltbase_row_id > after`, in row-id order — keyset paging, never OFFSET (study §10 #462) —
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
    let tx = timed(
        TIMEOUT,
        "begin page snapshot",
        conn.client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start(),
    )
    .await?;
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
fn eav_select(tables: &Tables, schema: &SchemaDef) -> String {
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
        .map_err(|e| Error::Invariant(format!("reading the live-row estimate: {e}")))?;
    let rows = plan[0]["Plan"]["Plan Rows"].as_f64().ok_or_else(|| {
        Error::Invariant(format!("no \"Plan Rows\" in the estimate's plan: {plan}"))
    })?;
    Ok(rows.max(0.0).round() as i64)
}

/// The mark step (`flushed_at = T`) on its own connection, its statement prepared once.
#[derive(Debug)]
pub struct Marker {
    client: Client,
    stmt: Statement,
}

impl Marker {
    /// Tunes `client` for lookups and prepares the mark statement on it.
    pub async fn new(client: Client, tables: &Tables) -> Result<Self> {
        tune_for_lookups(&client).await?;
        // The slots must be visited in the order given (row_id order, see `mark`): without
        // index and bitmap scans the only cheap plan is a nested loop driven by the arrays,
        // each slot fetched by its TID. (On a small table the planner would otherwise drive
        // the loop from the dirty index, in changed_at order.)
        timed(
            TIMEOUT,
            "tune mark session",
            client.batch_execute(
                "SET enable_indexscan = off; SET enable_indexonlyscan = off; \
                 SET enable_bitmapscan = off",
            ),
        )
        .await?;
        // The slot is found by its `ctid` (a TID scan, no index descent); the full predicate
        // is still checked, so only a slot still holding the exported version is marked.
        let sql = format!(
            "UPDATE {} AS cl SET flushed_at = $1 \
             FROM unnest($3::tid[], $4::uuid[], $5::int8[]) AS v(tid, row_id, changed_at) \
             WHERE cl.ctid = v.tid AND cl.schema_id = $2 AND cl.flushed_at = 0 \
             AND cl.row_id = v.row_id AND cl.changed_at = v.changed_at",
            tables.change_log.quoted()
        );
        let stmt = timed(TIMEOUT, "prepare mark", client.prepare(&sql)).await?;
        Ok(Self { client, stmt })
    }

    /// Marks the exported slots flushed at `flushed_at`, only where `changed_at` still equals
    /// the exported version (never `<=`): a row written since stays dirty. Returns the rows
    /// marked. The slots are visited, and so locked, in `row_id` order, the order in which
    /// the application's batch writers lock rows (study §10 #554): in selection order
    /// (`changed_at`) the mark could hold one row a writer needs while waiting for another that
    /// writer holds, and PostgreSQL would end one of them as a deadlock.
    pub async fn mark(
        &self,
        schema_id: i16,
        flushed_at: i64,
        versions: &[Selected],
    ) -> Result<u64> {
        let mut versions: Vec<&Selected> = versions.iter().collect();
        versions.sort_by_key(|v| v.row_id);
        let tids: Vec<Tid> = versions.iter().map(|v| v.tid).collect();
        let ids: Vec<Uuid> = versions.iter().map(|v| v.row_id).collect();
        let changed: Vec<i64> = versions.iter().map(|v| v.changed_at).collect();
        timed(
            TIMEOUT,
            "mark flushed",
            self.client.execute(
                &self.stmt,
                &[&flushed_at, &schema_id, &tids, &ids, &changed],
            ),
        )
        .await
    }
}

/// The distinct slot columns the schema binds, sorted by name.
pub fn bound_columns(schema: &SchemaDef) -> Vec<(String, SlotType)> {
    let mut cols: Vec<(String, SlotType)> = schema
        .attributes
        .iter()
        .filter_map(|a| a.binding.as_ref().map(|b| (b.column.clone(), b.slot)))
        .collect();
    cols.sort();
    cols.dedup();
    cols
}

fn batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| Error::Invariant(format!("building an Arrow batch failed: {e}")))
}

/// One Arrow column being built from result rows.
enum Column {
    Uuid(FixedSizeBinaryBuilder),
    Smallint(Int16Builder),
    Integer(Int32Builder),
    Bigint(Int64Builder),
    Double(Float64Builder),
    /// Text is gathered as bytes and checked to be UTF-8 once per column, when finished: one
    /// pass over the whole buffer instead of one call per value.
    Text(BinaryBuilder),
}

impl Column {
    fn new(kind: SlotType, rows: usize) -> Self {
        match kind {
            SlotType::Uuid => Self::Uuid(FixedSizeBinaryBuilder::with_capacity(rows, 16)),
            SlotType::Smallint => Self::Smallint(Int16Builder::with_capacity(rows)),
            SlotType::Integer => Self::Integer(Int32Builder::with_capacity(rows)),
            SlotType::Bigint => Self::Bigint(Int64Builder::with_capacity(rows)),
            SlotType::Double => Self::Double(Float64Builder::with_capacity(rows)),
            SlotType::Text => Self::Text(BinaryBuilder::with_capacity(rows, rows * 16)),
        }
    }

    /// Appends column `idx` of `row` (rows arrive in binary format, as binary COPY values do).
    fn push(&mut self, row: &Row, idx: usize) -> Result<()> {
        let raw = row
            .try_get::<_, Option<Raw>>(idx)
            .map_err(|e| Error::Invariant(format!("decoding result column {idx}: {e}")))?;
        self.push_binary(raw.map(|r| r.0))
    }

    /// Appends one value in PostgreSQL's binary format (`None` is NULL).
    fn push_binary(&mut self, raw: Option<&[u8]>) -> Result<()> {
        fn fixed<const N: usize>(raw: &[u8]) -> Result<[u8; N]> {
            raw.try_into().map_err(|_| {
                Error::Invariant(format!(
                    "binary COPY value has {} bytes, expected {N}",
                    raw.len()
                ))
            })
        }
        match (self, raw) {
            (Self::Uuid(b), None) => b.append_null(),
            (Self::Uuid(b), Some(v)) => b
                .append_value(fixed::<16>(v)?)
                .map_err(|e| Error::Invariant(format!("uuid column: {e}")))?,
            (Self::Smallint(b), v) => {
                b.append_option(v.map(fixed::<2>).transpose()?.map(i16::from_be_bytes))
            }
            (Self::Integer(b), v) => {
                b.append_option(v.map(fixed::<4>).transpose()?.map(i32::from_be_bytes))
            }
            (Self::Bigint(b), v) => {
                b.append_option(v.map(fixed::<8>).transpose()?.map(i64::from_be_bytes))
            }
            (Self::Double(b), v) => {
                b.append_option(v.map(fixed::<8>).transpose()?.map(f64::from_be_bytes))
            }
            (Self::Text(b), v) => b.append_option(v),
        }
        Ok(())
    }

    /// The column (`name`, for errors) as an Arrow array.
    fn finish(&mut self, name: &str) -> Result<ArrayRef> {
        Ok(match self {
            Self::Uuid(b) => Arc::new(b.finish()),
            Self::Smallint(b) => Arc::new(b.finish()),
            Self::Integer(b) => Arc::new(b.finish()),
            Self::Bigint(b) => Arc::new(b.finish()),
            Self::Double(b) => Arc::new(b.finish()),
            Self::Text(b) => {
                let (offsets, values, nulls) = b.finish().into_parts();
                Arc::new(StringArray::try_new(offsets, values, nulls).map_err(|e| {
                    Error::Invariant(format!("column {name}: text is not UTF-8: {e}"))
                })?)
            }
        })
    }
}

/// An Arrow batch of `columns` (name, kind, nullable) built row by row, as rows arrive: each
/// row's values sit together in memory, so one pass over a row beats one pass per column.
struct BatchBuilder {
    fields: Vec<Field>,
    builders: Vec<Column>,
}

impl BatchBuilder {
    fn new(columns: &[(&str, SlotType, bool)], capacity: usize) -> Self {
        let fields = columns
            .iter()
            .map(|(name, kind, nullable)| match kind {
                SlotType::Uuid => uuid_field(name, *nullable),
                SlotType::Smallint => Field::new(*name, DataType::Int16, *nullable),
                SlotType::Integer => Field::new(*name, DataType::Int32, *nullable),
                SlotType::Bigint => Field::new(*name, DataType::Int64, *nullable),
                SlotType::Double => Field::new(*name, DataType::Float64, *nullable),
                SlotType::Text => Field::new(*name, DataType::Utf8, *nullable),
            })
            .collect();
        let builders = columns
            .iter()
            .map(|(_, kind, _)| Column::new(*kind, capacity))
            .collect();
        Self { fields, builders }
    }

    fn entities(bound: &[(String, SlotType)], capacity: usize) -> Self {
        let mut columns = vec![
            ("ltbase_row_id", SlotType::Uuid, false),
            ("ltbase_created_at", SlotType::Bigint, false),
            ("ltbase_updated_at", SlotType::Bigint, false),
            ("ltbase_deleted_at", SlotType::Bigint, true),
        ];
        columns.extend(
            bound
                .iter()
                .map(|(name, slot)| (name.as_str(), *slot, true)),
        );
        Self::new(&columns, capacity)
    }

    fn eav(capacity: usize) -> Self {
        Self::new(
            &[
                ("row_id", SlotType::Uuid, false),
                ("attr_id", SlotType::Smallint, false),
                // NULL when the schema has no list attribute (see `eav_select`).
                ("array_indices", SlotType::Text, true),
                ("value_text", SlotType::Text, true),
                ("value_numeric", SlotType::Double, true),
            ],
            capacity,
        )
    }

    fn push(&mut self, row: &Row) -> Result<()> {
        for (idx, b) in self.builders.iter_mut().enumerate() {
            b.push(row, idx)?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<RecordBatch> {
        let columns = self
            .builders
            .iter_mut()
            .zip(&self.fields)
            .map(|(b, f)| b.finish(f.name()))
            .collect::<Result<_>>()?;
        batch(self.fields, columns)
    }
}

/// Runs `statement` and decodes its rows into `decoding` as they stream in (no intermediate
/// row list), under the statement time limit. On a tapped connection armed for them, the rows
/// never reach tokio-postgres (the tap decodes them) and the stream only ends.
///
/// `statement` is prepared: a statement prepared here would send (and answer) more than one
/// request while the tap is armed for this one.
async fn stream_into(
    tx: &Transaction<'_>,
    op: &'static str,
    statement: &Statement,
    params: &[&(dyn ToSql + Sync)],
    decoding: &Mutex<Decoding>,
) -> Result<()> {
    let read = async {
        let stream = tx
            .query_raw(statement, params.iter().map(|p| *p as &dyn ToSql))
            .await
            .map_err(Error::postgres(op))?;
        futures::pin_mut!(stream);
        while let Some(row) = stream.try_next().await.map_err(Error::postgres(op))? {
            copy_tap::lock(decoding).push_row(&row)?;
        }
        // The tap has passed CommandComplete on only after the rows before it: the rows
        // decoded either way must be the rows the server says it sent.
        let sent = stream.rows_affected();
        let decoded = copy_tap::lock(decoding).rows();
        if sent != Some(decoded as u64) {
            return Err(Error::Invariant(format!(
                "{op}: the server sent {sent:?} rows, {decoded} were decoded"
            )));
        }
        Ok(())
    };
    within(TIMEOUT, op, read).await
}

/// The signature opening a binary COPY stream, followed by a 32-bit flags field and a 32-bit
/// header-extension length.
const COPY_SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

/// Runs `COPY (query) TO STDOUT (FORMAT binary)` and decodes its tuples into `into` as they
/// stream in — no row objects: each value is appended straight from the wire bytes, taken from
/// the connection's `tap` when it has one (or from tokio-postgres's messages when it has not).
/// COPY takes no parameters, so `query` may only embed values lakecdc formats itself (ids and
/// row ids). Returns the batch and the rows read.
async fn copy_into(
    tx: &Transaction<'_>,
    tap: &CopyTap,
    op: &'static str,
    query: &str,
    into: BatchBuilder,
) -> Result<(BatchBuilder, usize)> {
    let sql = format!("COPY ({query}) TO STDOUT (FORMAT binary)");
    let decoding = Decoding::shared(op, CopyDecoder::default(), into);
    let read = async {
        let armed = tap.arm(decoding.clone());
        let stream = tx
            .copy_out(sql.as_str())
            .await
            .map_err(Error::postgres(op))?;
        futures::pin_mut!(stream);
        while let Some(chunk) = stream.try_next().await.map_err(Error::postgres(op))? {
            copy_tap::lock(&decoding).copy_data(&chunk);
        }
        // The stream has ended: the tap passed CopyDone on only after the data before it.
        drop(armed);
        Ok(())
    };
    within(TIMEOUT, op, read).await?;
    copy_tap::lock(&decoding).finish()
}

/// A statement's rows being decoded into a batch: binary COPY data or binary DataRow payloads
/// from a connection's tap, or rows from tokio-postgres. Shared between the reader and the tap.
struct Decoding {
    op: &'static str,
    decoder: CopyDecoder,
    into: BatchBuilder,
    /// Rows that came as tokio-postgres rows.
    pushed: usize,
    /// The first decoding error; later data is dropped.
    error: Option<Error>,
}

impl Decoding {
    fn shared(op: &'static str, decoder: CopyDecoder, into: BatchBuilder) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            op,
            decoder,
            into,
            pushed: 0,
            error: None,
        }))
    }

    /// Rows decoded so far, either way.
    fn rows(&self) -> usize {
        self.decoder.rows + self.pushed
    }

    /// Appends a row tokio-postgres parsed (an untapped connection).
    fn push_row(&mut self, row: &Row) -> Result<()> {
        self.into.push(row)?;
        self.pushed += 1;
        Ok(())
    }

    /// The batch and the rows decoded, or the first error. Leaves an empty batch behind.
    fn finish(&mut self) -> Result<(BatchBuilder, usize)> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let rows = std::mem::take(&mut self.decoder).finish(self.op)? + self.pushed;
        Ok((
            std::mem::replace(&mut self.into, BatchBuilder::new(&[], 0)),
            rows,
        ))
    }
}

impl CopySink for Decoding {
    fn copy_data(&mut self, bytes: &[u8]) {
        if self.error.is_none()
            && let Err(e) = self.decoder.feed(self.op, bytes, &mut self.into)
        {
            self.error = Some(e);
        }
    }
}

/// A binary COPY stream being decoded into a [`BatchBuilder`], message by message.
#[derive(Default)]
struct CopyDecoder {
    /// Bytes of an incomplete header or tuple, waiting for the next message.
    buf: bytes::BytesMut,
    header: bool,
    ended: bool,
    /// DataRow payloads: tuples with no header and no end marker.
    rows_only: bool,
    rows: usize,
}

impl CopyDecoder {
    /// A decoder of DataRow payloads (a binary-format query's rows, laid out as COPY tuples).
    fn data_rows() -> Self {
        Self {
            header: true,
            rows_only: true,
            ..Self::default()
        }
    }

    /// Decodes the complete tuples `chunk` ends (and whatever `buf` held before it).
    fn feed(&mut self, op: &str, chunk: &[u8], into: &mut BatchBuilder) -> Result<()> {
        if self.header && self.buf.is_empty() {
            // The usual case (PostgreSQL sends each tuple in a message of its own): the tuples
            // are decoded where they lie, and only an incomplete one is kept.
            let (used, n, end) = decode_tuples(chunk, into)?;
            self.rows += n;
            self.ended |= end;
            self.buf.extend_from_slice(&chunk[used..]);
            return self.check_end(op);
        }
        self.buf.extend_from_slice(chunk);
        if !self.header {
            let Some(ext) = self.buf.get(15..19) else {
                return Ok(());
            };
            let ext = u32::from_be_bytes([ext[0], ext[1], ext[2], ext[3]]) as usize;
            if self.buf.get(..11) != Some(COPY_SIGNATURE) {
                return Err(Error::Invariant(format!("{op}: not a binary COPY stream")));
            }
            if self.buf.len() < 19 + ext {
                return Ok(());
            }
            self.buf.advance(19 + ext);
            self.header = true;
        }
        let (used, n, end) = decode_tuples(&self.buf, into)?;
        self.buf.advance(used);
        self.rows += n;
        self.ended |= end;
        self.check_end(op)
    }

    /// Rows carry no end marker: a field count of -1 in one is a broken stream.
    fn check_end(&self, op: &str) -> Result<()> {
        if self.rows_only && self.ended {
            return Err(Error::Invariant(format!(
                "{op}: a data row has a field count of -1"
            )));
        }
        Ok(())
    }

    /// The tuples decoded, once the stream has ended exactly at its end-of-data marker (rows:
    /// at the end of a row).
    fn finish(self, op: &str) -> Result<usize> {
        if !(self.ended || self.rows_only) || !self.buf.is_empty() {
            let what = if self.rows_only {
                "binary data rows ended inside a row"
            } else {
                "binary COPY stream ended early"
            };
            return Err(Error::Invariant(format!(
                "{op}: {what} ({} bytes left)",
                self.buf.len()
            )));
        }
        Ok(self.rows)
    }
}

/// Decodes the complete tuples at the front of `data` into `into`. Returns the bytes they
/// took, the tuples decoded and whether the end-of-data marker was reached.
fn decode_tuples(data: &[u8], into: &mut BatchBuilder) -> Result<(usize, usize, bool)> {
    fn field_len(data: &[u8], at: usize) -> Option<i32> {
        let b = data.get(at..at + 4)?;
        Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    let mut rows = 0;
    let mut used = 0;
    loop {
        let data = &data[used..];
        let Some(count) = data.get(..2).map(|b| i16::from_be_bytes([b[0], b[1]])) else {
            return Ok((used, rows, false));
        };
        if count == -1 {
            return Ok((used + 2, rows, true));
        }
        if usize::try_from(count).ok() != Some(into.builders.len()) {
            return Err(Error::Invariant(format!(
                "binary COPY tuple has {count} fields, expected {}",
                into.builders.len()
            )));
        }
        // Only a complete tuple is decoded, so no column is ever left one value short.
        let mut end = 2;
        let mut complete = true;
        for _ in 0..into.builders.len() {
            match field_len(data, end) {
                None => {
                    complete = false;
                    break;
                }
                Some(len) => end += 4 + usize::try_from(len).unwrap_or(0),
            }
        }
        if !complete || data.len() < end {
            return Ok((used, rows, false));
        }
        let mut at = 2;
        for b in into.builders.iter_mut() {
            let len = field_len(data, at).unwrap_or(-1);
            at += 4;
            match usize::try_from(len) {
                Ok(n) => {
                    b.push_binary(data.get(at..at + n))?;
                    at += n;
                }
                Err(_) => b.push_binary(None)?,
            }
        }
        used += end;
        rows += 1;
    }
}

/// The row id in column 0 of `batch` at `idx`.
fn row_id_at(batch: &RecordBatch, idx: usize) -> Result<Uuid> {
    let ids = batch
        .column(0)
        .as_any()
        .downcast_ref::<FixedSizeBinaryArray>()
        .ok_or_else(|| Error::Invariant("row id column is not 16-byte binary".into()))?;
    Uuid::from_slice(ids.value(idx)).map_err(|e| Error::Invariant(format!("row id column: {e}")))
}

fn change_log_batch(rows: &[Row]) -> Result<RecordBatch> {
    let mut b = BatchBuilder::new(
        &[
            ("row_id", SlotType::Uuid, false),
            ("changed_at", SlotType::Bigint, false),
            ("deleted_at", SlotType::Bigint, true),
        ],
        rows.len(),
    );
    for row in rows {
        b.push(row)?;
    }
    b.finish()
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::Int64Type;

    use super::*;

    /// One binary COPY tuple of (uuid, bigint, text).
    fn tuple(id: u128, n: Option<i64>, s: Option<&str>) -> Vec<u8> {
        let mut t = 3i16.to_be_bytes().to_vec();
        t.extend(16i32.to_be_bytes());
        t.extend(id.to_be_bytes());
        match n {
            Some(n) => {
                t.extend(8i32.to_be_bytes());
                t.extend(n.to_be_bytes());
            }
            None => t.extend((-1i32).to_be_bytes()),
        }
        match s {
            Some(s) => {
                t.extend(i32::try_from(s.len()).unwrap().to_be_bytes());
                t.extend(s.as_bytes());
            }
            None => t.extend((-1i32).to_be_bytes()),
        }
        t
    }

    fn builder() -> BatchBuilder {
        BatchBuilder::new(
            &[
                ("id", SlotType::Uuid, false),
                ("n", SlotType::Bigint, true),
                ("s", SlotType::Text, true),
            ],
            4,
        )
    }

    #[test]
    fn text_that_is_not_utf8_is_refused_even_when_the_column_s_bytes_are() {
        let text = |values: &[&[u8]]| {
            let mut into = builder();
            for (i, v) in values.iter().enumerate() {
                let mut t = tuple(i as u128, None, Some("")).to_vec();
                t.truncate(t.len() - 4);
                t.extend(i32::try_from(v.len()).unwrap().to_be_bytes());
                t.extend(*v);
                assert_eq!(decode_tuples(&t, &mut into).unwrap().1, 1);
            }
            into.finish()
        };
        let ok = text(&["é".as_bytes(), b"", "∑x".as_bytes()]).unwrap();
        let s = ok.column(2).as_string::<i32>();
        assert_eq!((s.value(0), s.value(1), s.value(2)), ("é", "", "∑x"));
        let err = text(&[b"a", &[0xff]]).unwrap_err().to_string();
        assert!(err.contains("column s: text is not UTF-8"), "{err}");
        // Each value alone is invalid, though together they spell "é": still refused.
        assert!(text(&[&[0xc3], &[0xa9]]).is_err());
    }

    #[test]
    fn data_rows_decode_whatever_the_chunking_and_refuse_an_end_marker_or_a_cut_row() {
        let rows = [tuple(1, Some(7), Some("x")), tuple(2, None, None)].concat();
        for n in [1, 5, rows.len()] {
            let mut into = builder();
            let mut decoder = CopyDecoder::data_rows();
            for piece in rows.chunks(n) {
                decoder.feed("rows", piece, &mut into).unwrap();
            }
            assert_eq!(decoder.finish("rows").unwrap(), 2, "pieces of {n}");
            assert_eq!(
                row_id_at(&into.finish().unwrap(), 1).unwrap(),
                Uuid::from_u128(2)
            );
        }
        let mut into = builder();
        let mut decoder = CopyDecoder::data_rows();
        let err = decoder.feed("rows", &(-1i16).to_be_bytes(), &mut into);
        assert!(err.unwrap_err().to_string().contains("field count of -1"));
        let mut decoder = CopyDecoder::data_rows();
        decoder
            .feed("rows", &rows[..rows.len() - 1], &mut into)
            .unwrap();
        let err = decoder.finish("rows").unwrap_err().to_string();
        assert!(err.contains("ended inside a row"), "{err}");
    }

    #[test]
    fn binary_copy_tuples_decode_whatever_the_chunking() {
        // Header (signature, flags, a 3-byte extension), three tuples, the end marker.
        let mut header = COPY_SIGNATURE.to_vec();
        header.extend(0u32.to_be_bytes());
        header.extend(3u32.to_be_bytes());
        header.extend([9, 9, 9]);
        let mut end = tuple(3, Some(i64::MAX), None);
        end.extend((-1i16).to_be_bytes());
        // One message per tuple, as PostgreSQL sends them.
        let tuples = vec![
            header,
            tuple(1, Some(-5), Some("ä,\"x\"\n")),
            tuple(2, None, Some("")),
            end,
        ];
        let stream = tuples.concat();
        // Also messages of 1, 3 and 7 bytes, and everything at once.
        let chunkings: Vec<Vec<Vec<u8>>> = [1, 3, 7, stream.len()]
            .iter()
            .map(|n| stream.chunks(*n).map(<[u8]>::to_vec).collect())
            .chain([tuples])
            .collect();
        for (i, messages) in chunkings.iter().enumerate() {
            let mut into = builder();
            let mut decoder = CopyDecoder::default();
            for m in messages {
                decoder.feed("test", m, &mut into).unwrap();
            }
            assert_eq!(decoder.finish("test").unwrap(), 3, "chunking {i}");
            let b = into.finish().unwrap();
            assert_eq!(row_id_at(&b, 2).unwrap(), Uuid::from_u128(3));
            let n = b.column(1).as_primitive::<Int64Type>();
            assert_eq!((n.value(0), n.is_null(1), n.value(2)), (-5, true, i64::MAX));
            let s = b.column(2).as_string::<i32>();
            assert_eq!(
                (s.value(0), s.value(1), s.is_null(2)),
                ("ä,\"x\"\n", "", true)
            );
            assert!(s.is_valid(1), "an empty string is not NULL");
        }
        // A stream cut short, or with bytes after its end marker, is an error.
        let mut decoder = CopyDecoder::default();
        decoder
            .feed("test", &stream[..stream.len() - 2], &mut builder())
            .unwrap();
        assert!(decoder.finish("test").is_err());
        let mut decoder = CopyDecoder::default();
        let mut longer = stream.clone();
        longer.push(0);
        decoder.feed("test", &longer, &mut builder()).unwrap();
        assert!(decoder.finish("test").is_err());
    }

    #[test]
    fn a_tuple_of_the_wrong_shape_is_an_error_not_a_shifted_column() {
        assert!(decode_tuples(&2i16.to_be_bytes(), &mut builder()).is_err());
        let mut t = tuple(1, Some(1), None);
        t[2..6].copy_from_slice(&4i32.to_be_bytes()); // a 4-byte "uuid"
        t.drain(10..22);
        assert!(decode_tuples(&t, &mut builder()).is_err());
    }
}
