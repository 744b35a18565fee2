//! Reading one flush batch: the selection of dirty slots, and their payload — the slots
//! themselves, their `entity_main` rows and their EAV rows — read in ONE `REPEATABLE READ READ
//! ONLY` transaction so that every table is seen at the same instant (no payload skew,
//! docs/hazards.md #45). Values travel as parameters (`= ANY($n)`), never as SQL text; results come back in
//! binary form and leave this module as Arrow batches. Also the mark step: `flushed_at = T`
//! only where `changed_at` still equals the exported version.

use arrow::record_batch::RecordBatch;
use bytes::BufMut;
use futures::TryStreamExt;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, Row, Statement};
use uuid::Uuid;

use super::READ_TIMEOUT as TIMEOUT;
use super::connect::{TappedClient, timed, within};
use super::copy_decoder::CopyDecoder;
use super::copy_tap::{self, Divert, SharedSink};
use super::decoding::{Decoding, begin_snapshot, stream_into};
use super::live::eav_select;
use super::rows::{BatchBuilder, bound_columns};
use crate::config::Tables;
use crate::error::{Error, Result};
use crate::schema::batch::change_log;
use crate::schema::{SchemaDef, SlotType};

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tid {
    block: u32,
    offset: u16,
}

impl Tid {
    /// The `tid` in PostgreSQL's binary form (a 4-byte block, a 2-byte offset), as binary COPY
    /// data carries it; `None` when `raw` is not 6 bytes.
    pub(super) fn from_binary(raw: &[u8]) -> Option<Self> {
        match raw {
            [b0, b1, b2, b3, o0, o1] => Some(Self {
                block: u32::from_be_bytes([*b0, *b1, *b2, *b3]),
                offset: u16::from_be_bytes([*o0, *o1]),
            }),
            _ => None,
        }
    }
}

impl<'a> FromSql<'a> for Tid {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Self::from_binary(raw).ok_or_else(|| format!("a tid is 6 bytes, got {}", raw.len()).into())
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
    /// Whether the entity and EAV rows were read by the batch's row-id range
    /// ([`RANGE_DENSITY`]): they may then hold rows of the range that are not the batch's,
    /// which the export's join drops.
    pub by_range: bool,
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

/// The batch-read statements of one schema, prepared once per run (planned once: no
/// per-batch planning of large array parameters).
#[derive(Debug, Clone)]
pub struct BatchStatements {
    first: Statement,
    after: Statement,
    by_id: Statement,
    entities: Statement,
    /// The batch's entity rows by row-id range (`$2 ..= $3`): see [`Payload::Range`].
    entities_range: Statement,
    /// Counts the schema's entities in a row-id range, up to a limit (`$4`).
    probe: Statement,
    /// The bound slot columns the entity read returns.
    bound: Vec<(String, SlotType)>,
    /// `None` when the schema has no EAV attribute.
    eav: Option<Statement>,
    /// The EAV rows of a row-id range; `None` when the schema has no EAV attribute.
    eav_range: Option<Statement>,
}

/// A batch is read by its row-id range rather than by its ids when the range holds at most
/// this many of the schema's entities per slot: a range is one index descent and a walk along
/// neighbouring leaves, where `= ANY` descends the index once per id — about three times the
/// statement's time for the entity read (docs/design.md §4.1). The rows of the range that are
/// not the batch's are read, sent and dropped by the join, so the bound also bounds that waste
/// and the batch's memory.
pub const RANGE_DENSITY: usize = 2;

/// How a batch's entity and EAV rows are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payload {
    /// By the batch's ids (`= ANY`).
    Ids,
    /// By the row-id range from the batch's lowest id to its highest: every entity of the
    /// schema in it, and its EAV rows. The export's join takes the batch's rows and drops the
    /// others (a slot's row is in its range), exactly as it drops the rows of ids the read
    /// returns that are not the batch's.
    Range(Uuid, Uuid),
}

impl BatchStatements {
    /// Prepares the slot, entity and EAV reads for `schema` on `client`.
    pub async fn prepare(client: &Client, tables: &Tables, schema: &SchemaDef) -> Result<Self> {
        let cl = tables.change_log.quoted();
        let first = dirty_slots_sql(tables, true, &"$1", &"$2", None);
        let after = format!(
            "SELECT row_id, changed_at, deleted_at, ctid FROM {cl} WHERE schema_id = $1 AND flushed_at = 0 \
             AND changed_at >= $3 AND (changed_at, row_id) > ($3, $4) ORDER BY changed_at, row_id LIMIT $2"
        );
        // A chunk's slots, read again inside its snapshot (see `read_chunk`) by their tuple
        // addresses (a TID scan, no index descent), checking the row id and that they are
        // still dirty. They come back in the order given (a window's batch is cut in row-id
        // order), whatever join the planner picks: sorting the ordinals of an ordered list
        // costs next to nothing.
        let by_id = format!(
            "SELECT cl.row_id, cl.changed_at, cl.deleted_at, cl.ctid \
             FROM unnest($2::tid[], $3::uuid[]) WITH ORDINALITY AS v(tid, row_id, n) \
             JOIN {cl} AS cl ON cl.ctid = v.tid \
             WHERE cl.schema_id = $1 AND cl.flushed_at = 0 AND cl.row_id = v.row_id ORDER BY v.n"
        );
        let bound = bound_columns(schema);
        let select_cols: String = bound.iter().map(|(c, _)| format!(", {c}")).collect();
        let entity = tables.entity.quoted();
        let entities_from = format!(
            "SELECT ltbase_row_id, ltbase_created_at, ltbase_updated_at, ltbase_deleted_at{select_cols} \
             FROM {entity} WHERE ltbase_schema_id = $1 AND "
        );
        let entities = format!("{entities_from}ltbase_row_id = ANY($2)");
        let entities_range = format!("{entities_from}ltbase_row_id BETWEEN $2 AND $3");
        let probe = format!(
            "SELECT count(*) FROM (SELECT 1 FROM {entity} WHERE ltbase_schema_id = $1 \
             AND ltbase_row_id BETWEEN $2 AND $3 LIMIT $4) AS r"
        );
        // Every EAV row of the batch's entities: the pivot picks the schema's attributes by id
        // and ignores others. An `attr_id = ANY(..)` condition here would make the index scan
        // descend once per (row, attribute) pair — three times the work for three attributes.
        let eav_select = eav_select(client, tables, schema).await?;
        let eav = format!("{eav_select} WHERE schema_id = $1 AND row_id = ANY($2)");
        let eav_range = format!("{eav_select} WHERE schema_id = $1 AND row_id BETWEEN $2 AND $3");
        let prepare = |sql: String, op: &'static str| async move {
            timed(TIMEOUT, op, client.prepare(&sql)).await
        };
        Ok(Self {
            first: timed(TIMEOUT, "prepare change_log read", client.prepare(&first)).await?,
            after: timed(TIMEOUT, "prepare change_log read", client.prepare(&after)).await?,
            by_id: timed(TIMEOUT, "prepare change_log read", client.prepare(&by_id)).await?,
            entities: prepare(entities, "prepare entity_main read").await?,
            entities_range: prepare(entities_range, "prepare entity_main read").await?,
            probe: prepare(probe, "prepare entity_main probe").await?,
            bound,
            eav: match schema.has_eav() {
                true => Some(prepare(eav, "prepare eav_data read").await?),
                false => None,
            },
            eav_range: match schema.has_eav() {
                true => Some(prepare(eav_range, "prepare eav_data read").await?),
                false => None,
            },
        })
    }
}

/// Selects up to `limit` dirty slots ordered by `(changed_at, row_id)`, strictly after `after`
/// when given (keyset paging, so a run never revisits a slot it has planned): a flush's
/// selection window, whose batches then read their slots again inside their snapshots
/// ([`read_chunk`]).
pub async fn select(
    client: &Client,
    stmts: &BatchStatements,
    schema_id: i16,
    limit: i64,
    after: Option<Selected>,
) -> Result<Vec<Selected>> {
    const OP: &str = "select batch";
    let (statement, params): (_, Vec<&(dyn ToSql + Sync)>) = match &after {
        None => (&stmts.first, vec![&schema_id, &limit]),
        Some(a) => (
            &stmts.after,
            vec![&schema_id, &limit, &a.changed_at, &a.row_id],
        ),
    };
    // Streamed into slots as the rows arrive: a window's slots as driver rows would take
    // several times their size.
    let read = async {
        let stream = client
            .query_raw(statement, params.iter().map(|p| *p as &dyn ToSql))
            .await
            .map_err(Error::postgres(OP))?;
        futures::pin_mut!(stream);
        let mut out = Vec::with_capacity(usize::try_from(limit.clamp(0, 65_536)).unwrap_or(0));
        while let Some(row) = stream.try_next().await.map_err(Error::postgres(OP))? {
            out.push(slot_of(&row).map_err(Error::postgres(OP))?);
        }
        Ok(out)
    };
    within(TIMEOUT, OP, read).await
}

/// Up to `limit` dirty slots of schema `schema_id` (each a parameter placeholder or a value
/// lakecdc formats) as slot rows (`row_id, changed_at, deleted_at, ctid`): the oldest first (by
/// `changed_at, row_id`, the selection order) when `oldest`, in any order otherwise; only
/// those on the heap pages of the `ctid` condition `pages` when given.
pub(super) fn dirty_slots_sql(
    tables: &Tables,
    oldest: bool,
    schema_id: &dyn std::fmt::Display,
    limit: &dyn std::fmt::Display,
    pages: Option<&str>,
) -> String {
    let order = match oldest {
        true => " ORDER BY changed_at, row_id",
        false => "",
    };
    let pages = pages.map(|p| format!(" AND {p}")).unwrap_or_default();
    format!(
        "SELECT row_id, changed_at, deleted_at, ctid FROM {} WHERE schema_id = {schema_id} \
         AND flushed_at = 0{pages}{order} LIMIT {limit}",
        tables.change_log.quoted()
    )
}

/// A slot row (`row_id, changed_at, deleted_at, ctid`) as a [`Selected`].
pub(super) fn slot_of(row: &Row) -> std::result::Result<Selected, tokio_postgres::Error> {
    Ok(Selected {
        row_id: row.try_get(0)?,
        changed_at: row.try_get(1)?,
        tid: row.try_get(3)?,
    })
}

fn selected(slots: &[Row]) -> Result<Vec<Selected>> {
    slots
        .iter()
        .map(|r| slot_of(r).map_err(Error::postgres("select batch")))
        .collect()
}

/// Reads one chunk of a selection window (docs/design.md §4.1): the chunk's slots, read again
/// by tuple address, and their entity and EAV rows, all in ONE repeatable-read snapshot, so the
/// payload is exactly the versions the slots carry in that snapshot (no skew,
/// docs/hazards.md #45). A slot written since the window was selected has moved to a new tuple
/// with a newer version: it is not read here and stays dirty for a later window or run. `before_payload` runs between the slots' read and the payload reads (a test
/// seam). The entity and EAV reads run as bitmap scans: a chunk's ids are a narrow, sorted
/// slice of the row-id space, so each index is descended over a few neighbouring leaves and
/// each heap page is visited once, in physical order, whatever the id order.
pub async fn read_chunk<F: std::future::Future<Output = ()>>(
    conn: &mut TappedClient,
    stmts: &BatchStatements,
    schema_id: i16,
    chunk: &[Selected],
    before_payload: impl FnOnce(&[Selected]) -> F,
) -> Result<Snapshot> {
    let tx = begin_snapshot(&mut conn.client, "begin snapshot").await?;
    let tids: Vec<Tid> = chunk.iter().map(|s| s.tid).collect();
    let ids: Vec<Uuid> = chunk.iter().map(|s| s.row_id).collect();
    let params: [&(dyn ToSql + Sync); 3] = [&schema_id, &tids, &ids];
    let slots = timed(TIMEOUT, "select batch", tx.query(&stmts.by_id, &params)).await?;
    let snapshot = read_payload(&conn.tap, tx, stmts, schema_id, slots, before_payload).await?;
    Ok(snapshot)
}

/// Reads the entity and EAV rows of `slots` in the snapshot `tx` and commits it.
async fn read_payload<F: std::future::Future<Output = ()>>(
    tap: &copy_tap::CopyTap,
    tx: tokio_postgres::Transaction<'_>,
    stmts: &BatchStatements,
    schema_id: i16,
    slots: Vec<Row>,
    before_payload: impl FnOnce(&[Selected]) -> F,
) -> Result<Snapshot> {
    let selected = selected(&slots)?;
    before_payload(&selected).await;
    let ids: Vec<Uuid> = selected.iter().map(|s| s.row_id).collect();
    let payload = choose_payload(&tx, stmts, schema_id, &ids).await?;
    let entities = Decoding::shared(CopyDecoder::data_rows(
        "read entity_main",
        BatchBuilder::entities(&stmts.bound, ids.len()),
    ));
    let eav = Decoding::shared(CopyDecoder::data_rows(
        "read eav_data",
        BatchBuilder::eav(ids.len() * 4),
    ));
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
    let (params, entity_stmt, eav_stmt): (Vec<&(dyn ToSql + Sync)>, _, _) = match &payload {
        Payload::Ids => (vec![&schema_id, &ids], &stmts.entities, &stmts.eav),
        Payload::Range(lo, hi) => (
            vec![&schema_id, lo, hi],
            &stmts.entities_range,
            &stmts.eav_range,
        ),
    };
    let entity_read = stream_into(&tx, "read entity_main", entity_stmt, &params, &entities);
    let eav_read = async {
        match eav_stmt {
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
        by_range: payload != Payload::Ids,
        versions: selected,
        change_log: change_log_batch(&slots)?,
        entities: entities.finish()?,
        eav: eav.finish()?,
    };
    Ok(snapshot)
}

/// How the payload of the batch `ids` is read: by its row-id range when that range holds at
/// most [`RANGE_DENSITY`] of the schema's entities per id (counted, up to that bound, in the
/// batch's snapshot `tx`), else by the ids. The choice only decides the cost: either read
/// returns every row of the batch.
async fn choose_payload(
    tx: &tokio_postgres::Transaction<'_>,
    stmts: &BatchStatements,
    schema_id: i16,
    ids: &[Uuid],
) -> Result<Payload> {
    const OP: &str = "count a batch's row-id range";
    let payload = match (ids.iter().min(), ids.iter().max()) {
        (Some(&lo), Some(&hi)) if ids.len() >= 2 => {
            // The count's plan must be an index-only scan, which stops at the limit: a bitmap
            // scan would first walk the whole range, however sparse the batch. Set before
            // every count, as its cached plan may be made again (after an ANALYZE) at any run.
            tune(tx, "SET LOCAL enable_bitmapscan = off").await?;
            let most = i64::try_from(ids.len().saturating_mul(RANGE_DENSITY)).unwrap_or(i64::MAX);
            let limit = most.saturating_add(1);
            let row = timed(
                TIMEOUT,
                OP,
                tx.query_one(&stmts.probe, &[&schema_id, &lo, &hi, &limit]),
            )
            .await?;
            let in_range: i64 = row.try_get(0).map_err(Error::postgres(OP))?;
            match in_range <= most {
                true => Payload::Range(lo, hi),
                false => Payload::Ids,
            }
        }
        _ => Payload::Ids,
    };
    // Only for this transaction, so that the payload statements' cached generic plans (made
    // at their first run, which is always here) are bitmap scans: each heap page is visited
    // once, in physical order, whatever the id order. The window selection keeps its ordered
    // index scan.
    tune(
        tx,
        "SET LOCAL enable_bitmapscan = on; SET LOCAL enable_indexscan = off",
    )
    .await?;
    Ok(payload)
}

/// Sets planner options for the rest of the snapshot's transaction.
async fn tune(tx: &tokio_postgres::Transaction<'_>, settings: &str) -> Result<()> {
    timed(TIMEOUT, "tune snapshot", tx.batch_execute(settings)).await
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

    /// Whether the connection's session has ended.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Marks the exported slots flushed at `flushed_at`, only where `changed_at` still equals
    /// the exported version (never `<=`): a row written since stays dirty. Returns the rows
    /// marked. The slots are visited, and so locked, in `row_id` order, the order in which
    /// the application's batch writers lock rows (docs/hazards.md #554): in selection order
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

fn change_log_batch(rows: &[Row]) -> Result<RecordBatch> {
    let mut b = BatchBuilder::new(&change_log::COLUMNS, rows.len());
    for row in rows {
        b.push(row)?;
    }
    b.finish()
}
