//! Reading a schema's live entities for init in heap order (docs/design.md §4.2, "Heap-order
//! reads").
//!
//! Keyset pages walk the `ltbase_row_id` index and fetch the heap in index order. With time-ordered
//! ids that order is the heap's own; with random ids (UUIDv4, imported or hashed keys) every page
//! lands on heap pages all over the table, and each EAV heap page is read again by nearly every
//! page query. A heap-order read instead scans both tables once, by ranges of heap pages (TID
//! range scans), in the one exported snapshot every reader imports, and routes each tuple by its
//! row id into one of a few row-id buckets, cut at quantiles of a sample of the ids so that each
//! holds about a file. Buckets are spilled to the run's private scratch directory as the raw
//! binary COPY tuples, appended in chunks; once the whole snapshot is read, each bucket is read
//! back, decoded, sorted by row id and handed on as one sorted page, so base files keep disjoint,
//! sorted row-id ranges. Memory stays bounded (a chunk buffer per bucket while reading, about a
//! file's rows per loaded bucket); scratch disk is the live rows' binary size, and is reported.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::record_batch::RecordBatch;
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

use super::Connector;
use super::READ_TIMEOUT as TIMEOUT;
use super::connect::{TappedClient, timed};
use super::copy_decoder::{
    CopyDecoder, CopyItem, Taken, Tuples, copy_tuple, decode_tuples, take_each,
};
use super::copy_tap::{self, CopyTap};
use super::decoding::copy_to_sink;
use super::live::{LivePage, SnapshotTicket, begin_in, eav_select, tune_for_pages};
use super::rows::{BatchBuilder, bound_columns};
use super::snapshot::{Selected, Tid, dirty_slots_sql};
use crate::config::Tables;
use crate::error::{Error, Result};
use crate::schema::batch::change_log;
use crate::schema::{SchemaDef, SlotType};
use crate::scratch::Piecewise;

/// How init reads a schema's live entities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadOrder {
    /// Heap order when the row ids are not in heap order (the planner's correlation of
    /// `ltbase_row_id` below [`HEAP_CORRELATION`]), for a schema of at least [`HEAP_MIN_ROWS`]
    /// live rows holding at least a quarter of the entity table; row-id order otherwise.
    #[default]
    Auto,
    /// Keyset pages in row-id order.
    RowId,
    /// Heap-order reads into row-id buckets.
    Heap,
}

impl std::str::FromStr for ReadOrder {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "row-id" => Ok(Self::RowId),
            "heap" => Ok(Self::Heap),
            other => Err(format!(
                "unknown read order {other:?}: use auto, row-id or heap"
            )),
        }
    }
}

/// Below this absolute correlation between `ltbase_row_id` and the heap's order (from
/// `pg_stats`), `auto` reads in heap order. Time-ordered ids inserted as they are made measure
/// above 0.99; random ones near 0.
pub const HEAP_CORRELATION: f64 = 0.9;

/// `auto` reads in heap order from this many live rows: below it, random heap reads cost
/// little (the table is mostly cached) and keyset pages need no scratch disk.
pub const HEAP_MIN_ROWS: f64 = 100_000.0;

/// Whether `auto` reads `live` rows of a table of `tuples` rows in heap order, given the
/// planner's `correlation` of `ltbase_row_id` with the heap's order (`None`: no statistics).
fn auto_heap(correlation: Option<f64>, tuples: f64, live: f64) -> bool {
    let scattered = correlation.is_some_and(|c| c.abs() < HEAP_CORRELATION);
    // A small schema of a large table is cheaper to read by its index.
    scattered && live >= HEAP_MIN_ROWS && live >= tuples * 0.25
}

/// Ids sampled per bucket to place the cuts (at least [`MIN_SAMPLE`] in all).
const SAMPLE_PER_BUCKET: f64 = 500.0;
const MIN_SAMPLE: f64 = 20_000.0;

/// Bytes of spill buffers per spill file, shared by its buckets (each gets 64 KiB to 1 MiB).
const SPILL_BUFFERS: usize = 16 * 1024 * 1024;

/// What a heap-order read does: the bucket cuts and the page ranges each table is read in.
#[derive(Debug, Clone)]
pub struct HeapPlan {
    /// Bucket `i` holds the row ids in `[cuts[i-1], cuts[i])` (the first from 0, the last
    /// without bound).
    cuts: Arc<[u128]>,
    /// `ctid` conditions, in heap order, covering every page of each table.
    entity_chunks: Vec<String>,
    eav_chunks: Vec<String>,
    /// The schema's share of the two tables' bytes: about what the spill will take.
    table_bytes: u64,
    /// Only live entities (init); a flush pass reads deleted ones too (their tombstones).
    live_only: bool,
}

impl HeapPlan {
    /// Number of row-id buckets (files, about).
    pub fn buckets(&self) -> usize {
        self.cuts.len() + 1
    }

    /// About the scratch disk the read will take: the schema's share of the tables' bytes.
    pub fn scratch_estimate(&self) -> u64 {
        self.table_bytes
    }
}

/// The bucket of row id `id`: the number of cuts at or below it.
fn bucket_of(cuts: &[u128], id: u128) -> usize {
    cuts.partition_point(|c| *c <= id)
}

/// Bits of a row id's top that [`Buckets`] looks its bucket range up by.
const PREFIX_BITS: u32 = 12;

/// The bucket cuts with a lookup by the row id's top [`PREFIX_BITS`] bits, which narrows a
/// row's bucket to the few cuts within its prefix: a router finds the bucket of each of tens
/// of millions of tuples, and a binary search over every cut (a mispredicted branch at each of
/// its steps) took a third of the routing's time.
struct Buckets {
    cuts: Arc<[u128]>,
    /// For each prefix `p`, the bucket of the smallest id with that prefix; one more entry,
    /// the number of cuts, ends the last prefix's range.
    first: Box<[u32]>,
}

impl Buckets {
    fn new(cuts: Arc<[u128]>) -> Self {
        let prefixes = 1u128 << PREFIX_BITS;
        let first = (0..=prefixes)
            .map(|p| match p < prefixes {
                true => bucket_of(&cuts, p << (128 - PREFIX_BITS)),
                false => cuts.len(),
            })
            .map(|b| u32::try_from(b).unwrap_or(u32::MAX))
            .collect();
        Self { cuts, first }
    }

    /// The bucket of row id `id`, as [`bucket_of`] gives it.
    fn of(&self, id: u128) -> usize {
        let p = (id >> (128 - PREFIX_BITS)) as usize;
        let lo = self.first.get(p).map_or(0, |&b| b as usize);
        let hi = self
            .first
            .get(p + 1)
            .map_or(self.cuts.len(), |&b| b as usize);
        match self.cuts.get(lo..hi) {
            Some(within) => lo + within.partition_point(|c| *c <= id),
            None => bucket_of(&self.cuts, id),
        }
    }
}

/// Sizes of the entity and EAV tables, and the row id's correlation with the heap's order.
struct Sizes {
    entity_pages: i64,
    entity_tuples: f64,
    entity_bytes: f64,
    eav_pages: i64,
    eav_tuples: f64,
    eav_bytes: f64,
    /// `change_log`'s heap pages (0 without the table: an init reads no slot and needs none).
    log_pages: i64,
    correlation: Option<f64>,
}

async fn sizes(client: &Client, tables: &Tables) -> Result<Sizes> {
    let (e, v, l) = (
        tables.entity.quoted(),
        tables.eav.quoted(),
        tables.change_log.quoted(),
    );
    let pages = "(pg_relation_size(c.oid) / current_setting('block_size')::int)::int8";
    let size = |t: &str| {
        format!(
            "(SELECT {pages}, \
                     GREATEST(c.reltuples, 0)::float8, pg_relation_size(c.oid)::float8 \
              FROM pg_class c WHERE c.oid = '{t}'::regclass)"
        )
    };
    let sql = format!(
        "SELECT e.*, v.*, (SELECT s.correlation::float8 FROM pg_stats s JOIN pg_class c \
                ON c.relname = s.tablename JOIN pg_namespace n ON n.oid = c.relnamespace \
                AND n.nspname = s.schemaname \
              WHERE c.oid = '{e}'::regclass AND s.attname = 'ltbase_row_id' LIMIT 1), \
              COALESCE((SELECT {pages} FROM pg_class c WHERE c.oid = to_regclass('{l}')), 0) \
         FROM {} AS e(pages, tuples, bytes), {} AS v(pages, tuples, bytes)",
        size(&e),
        size(&v)
    );
    let row = timed(
        TIMEOUT,
        "read the tables' sizes",
        client.query_one(&sql, &[]),
    )
    .await?;
    let mut s = Sizes {
        entity_pages: row.get(0),
        entity_tuples: row.get(1),
        entity_bytes: row.get(2),
        eav_pages: row.get(3),
        eav_tuples: row.get(4),
        eav_bytes: row.get(5),
        correlation: row.get(6),
        log_pages: row.get(7),
    };
    // A table never analysed has no `pg_stats` row and no `reltuples` (docs/design.md §4.2,
    // "Without statistics"): measured from a page sample instead, so that a schema's first
    // runs after a bulk load (before autovacuum's first ANALYZE) read as a later run would.
    if s.entity_pages > 0 && (s.correlation.is_none() || s.entity_tuples <= 0.0) {
        let sampled = sample_order(client, tables, s.entity_pages).await?;
        s.correlation = s.correlation.or(sampled.correlation);
        if s.entity_tuples <= 0.0 {
            s.entity_tuples = sampled.tuples;
        }
    }
    if s.eav_pages > 0 && s.eav_tuples <= 0.0 {
        s.eav_tuples = sample_count(client, &v, s.eav_pages).await?;
    }
    Ok(s)
}

/// Heap pages read by a sample that stands in for missing statistics: a few hundred pages
/// hold tens of thousands of rows, enough for a correlation and a count within a few percent.
const STATS_SAMPLE_PAGES: f64 = 300.0;

/// The share (percent) of a table of `pages` pages a statistics sample reads.
fn stats_sample_pct(pages: i64) -> f64 {
    (100.0 * STATS_SAMPLE_PAGES / pages.max(1) as f64).clamp(0.0001, 100.0)
}

/// The entity table's order and size as measured from a page sample.
struct SampledOrder {
    /// Rank correlation of `ltbase_row_id` with the rows' heap positions (`None`: fewer than
    /// two rows sampled).
    correlation: Option<f64>,
    /// The table's rows, scaled up from the sample.
    tuples: f64,
}

/// Samples whole heap pages of the entity table (`TABLESAMPLE SYSTEM`) and measures how its
/// row ids follow the heap's order, as the planner's `correlation` would.
async fn sample_order(client: &Client, tables: &Tables, pages: i64) -> Result<SampledOrder> {
    let pct = stats_sample_pct(pages);
    let sql = format!(
        "SELECT (ctid::text::point)[0]::int8, (ctid::text::point)[1]::int8, ltbase_row_id \
         FROM ONLY {} TABLESAMPLE SYSTEM ({pct:.6}) REPEATABLE (462)",
        tables.entity.quoted()
    );
    let rows = timed(
        TIMEOUT,
        "sample the entity table's order",
        client.query(&sql, &[]),
    )
    .await?;
    let sample: Vec<((i64, i64), u128)> = rows
        .iter()
        .map(|r| {
            Ok((
                (r.try_get::<_, i64>(0)?, r.try_get::<_, i64>(1)?),
                r.try_get::<_, Uuid>(2)?.as_u128(),
            ))
        })
        .collect::<std::result::Result<_, tokio_postgres::Error>>()
        .map_err(Error::postgres("read the entity table's sample"))?;
    Ok(SampledOrder {
        tuples: sample.len() as f64 * 100.0 / pct,
        correlation: rank_correlation(sample),
    })
}

/// Counts a table's rows from a page sample.
pub(super) async fn sample_count(
    client: &impl tokio_postgres::GenericClient,
    table: &str,
    pages: i64,
) -> Result<f64> {
    let pct = stats_sample_pct(pages);
    let sql =
        format!("SELECT count(*) FROM ONLY {table} TABLESAMPLE SYSTEM ({pct:.6}) REPEATABLE (462)");
    let row = timed(
        TIMEOUT,
        "count a table's rows from a sample",
        client.query_one(&sql, &[]),
    )
    .await?;
    let n: i64 = row
        .try_get(0)
        .map_err(Error::postgres("read a table's sampled count"))?;
    Ok(n as f64 * 100.0 / pct)
}

/// Spearman's rank correlation between the samples' heap positions and their ids (`None`
/// below two samples): near 1 for ids written in their order, near 0 for random ones.
fn rank_correlation(mut sample: Vec<((i64, i64), u128)>) -> Option<f64> {
    let n = sample.len();
    if n < 2 {
        return None;
    }
    // Heap rank = index once sorted by position; id rank from a sort of those indices by id.
    sample.sort_unstable_by_key(|(pos, _)| *pos);
    let mut by_id: Vec<usize> = (0..n).collect();
    by_id.sort_unstable_by_key(|&i| sample[i].1);
    // Both ranks are permutations of 0..n: their variance (times n) is n(n²-1)/12.
    let (nf, mean) = (n as f64, (n as f64 - 1.0) / 2.0);
    let cov: f64 = (by_id.iter().enumerate())
        .map(|(id_rank, &heap_rank)| (heap_rank as f64 - mean) * (id_rank as f64 - mean))
        .sum();
    Some(cov / (nf * (nf * nf - 1.0) / 12.0))
}

/// Decides how init reads schema `schema_id` (estimated `estimate` live rows) and, for a
/// heap-order read, plans it: about `bucket_rows` rows and at most `bucket_bytes` of the
/// tables' bytes per bucket, chunks of about `chunk_rows` rows. `None`: read in row-id order.
#[allow(clippy::too_many_arguments)]
pub async fn plan(
    client: &Client,
    tables: &Tables,
    schema_id: i16,
    order: ReadOrder,
    estimate: u64,
    bucket_rows: u64,
    bucket_bytes: u64,
    chunk_rows: u64,
) -> Result<Option<HeapPlan>> {
    // Too few rows for `auto` to read the heap: no catalog read, no sample.
    if !TableShape::may_pass(order, estimate) {
        return Ok(None);
    }
    let s = sizes(client, tables).await?;
    let est = estimate as f64;
    if order == ReadOrder::Auto && !auto_heap(s.correlation, s.entity_tuples, est) {
        return Ok(None);
    }
    let bytes = |live: f64| {
        let share = if s.entity_tuples > 0.0 {
            (live / s.entity_tuples).min(1.0)
        } else {
            1.0
        };
        (s.entity_bytes + s.eav_bytes) * share
    };
    let buckets = |live: f64| {
        (live / bucket_rows.max(1) as f64)
            .max(bytes(live) / bucket_bytes.max(1) as f64)
            .ceil()
            .max(1.0) as usize
    };
    // The sample also counts the live rows (exactly, for a table without statistics, which
    // is sampled whole): the planner's estimate of a table never analysed can be far off.
    let (ids, pct) = sample_ids(client, tables, schema_id, buckets(est), s.entity_tuples).await?;
    let live = ids.len() as f64 * 100.0 / pct;
    let cuts = quantile_cuts(&ids, buckets(live));
    let chunk_rows = chunk_rows.max(1) as f64;
    Ok(Some(HeapPlan {
        cuts: cuts.into(),
        entity_chunks: page_ranges(s.entity_pages, s.entity_tuples, chunk_rows),
        eav_chunks: page_ranges(s.eav_pages, s.eav_tuples, chunk_rows),
        table_bytes: bytes(live) as u64,
        live_only: true,
    }))
}

/// A flush pass reads in heap order from this share of the entity table's rows: it reads
/// every row of both tables, so it reads at most this many times the rows it exports.
pub const PASS_SHARE: f64 = 0.25;

/// The entity and EAV tables' sizes and the row id's order, from which a flush decides how it
/// reads a pass of dirty slots (docs/design.md §4.1, "Heap passes").
pub struct TableShape(Sizes);

impl TableShape {
    /// Reads the tables' sizes and `ltbase_row_id`'s correlation from the catalog.
    pub async fn read(client: &Client, tables: &Tables) -> Result<Self> {
        Ok(Self(sizes(client, tables).await?))
    }

    /// Whether a flush pass of `slots` dirty slots reads in heap order: always for
    /// [`ReadOrder::Heap`], never for [`ReadOrder::RowId`]; for `auto`, when the row ids are
    /// scattered over the heap and the pass holds at least [`HEAP_MIN_ROWS`] slots and
    /// [`PASS_SHARE`] of the entity table's rows.
    pub fn heap_pass(&self, order: ReadOrder, slots: u64) -> bool {
        let s = &self.0;
        match order {
            ReadOrder::Auto => {
                Self::may_pass(order, slots)
                    && s.correlation.is_some_and(|c| c.abs() < HEAP_CORRELATION)
                    && slots as f64 >= s.entity_tuples * PASS_SHARE
            }
            _ => Self::may_pass(order, slots),
        }
    }

    /// Whether a pass of `slots` slots can be read in heap order at all, before the tables'
    /// shape is read (and, for a table never analysed, sampled): never for
    /// [`ReadOrder::RowId`], nor for `auto` below [`HEAP_MIN_ROWS`] slots — a minutely flush
    /// of a few rows costs no catalog read or sample.
    pub fn may_pass(order: ReadOrder, slots: u64) -> bool {
        match order {
            ReadOrder::RowId => false,
            ReadOrder::Heap => true,
            ReadOrder::Auto => slots as f64 >= HEAP_MIN_ROWS,
        }
    }

    /// About the scratch disk a flush pass takes: every row of both tables.
    pub fn pass_scratch(&self) -> u64 {
        (self.0.entity_bytes + self.0.eav_bytes) as u64
    }

    /// `ctid` conditions splitting `change_log` into at most `n` ranges of about as many
    /// heap pages each ([`page_ranges`]: the last is open-ended), for a selection split over
    /// up to `n` readers ([`dirty_slots_split`]).
    pub fn slot_ranges(&self, n: usize) -> Vec<String> {
        let pages = self.0.log_pages.max(0);
        let per_range = (pages as f64 / n.max(1) as f64).ceil().max(1.0);
        page_ranges(pages, pages as f64, per_range)
    }

    /// The heap-order read of a flush pass whose batches hold the row ids from each of
    /// `cuts` to the next (the first batch from 0): every row of both tables, deleted
    /// entities included, in chunks of about `chunk_rows` rows.
    pub fn pass_plan(&self, cuts: Vec<u128>, chunk_rows: u64) -> HeapPlan {
        let s = &self.0;
        let chunk_rows = chunk_rows.max(1) as f64;
        HeapPlan {
            cuts: cuts.into(),
            entity_chunks: page_ranges(s.entity_pages, s.entity_tuples, chunk_rows),
            eav_chunks: page_ranges(s.eav_pages, s.eav_tuples, chunk_rows),
            table_bytes: self.pass_scratch(),
            live_only: false,
        }
    }
}

/// A dirty slot of a flush pass, with its tombstone time.
#[derive(Debug, Clone, Copy)]
pub struct PassSlot {
    /// The slot and the version it carries in the pass's snapshot.
    pub slot: Selected,
    /// `change_log.deleted_at`.
    pub deleted_at: Option<i64>,
}

/// Selects `limit` dirty slots of `schema_id` in the exported snapshot of `ticket`: the
/// versions a flush pass exports, seen at the instant its heap readers read the payload. The
/// oldest ones (by `changed_at, row_id`, as a window would) when `oldest`; any ones otherwise
/// (a pass that takes every dirty slot needs no order: it sorts them by row id), and then only
/// those on the `change_log` heap pages of `pages` when given (see [`dirty_slots_split`]). The
/// slots come as binary COPY data, decoded where they lie (through the connection's tap when
/// it has one): a million slots as rows cost lakecdc twice what they cost the server. Room is
/// made for the `expected` slots (the count the pass was decided on) and a margin for those
/// written since, the vector growing past it only if more come.
#[allow(clippy::too_many_arguments)]
pub async fn dirty_slots_in(
    conn: &mut TappedClient,
    ticket: SnapshotTicket,
    tables: &Tables,
    schema_id: i16,
    limit: i64,
    oldest: bool,
    pages: Option<&str>,
    expected: u64,
) -> Result<Vec<PassSlot>> {
    let query = dirty_slots_sql(tables, oldest, &schema_id, &limit, pages);
    let TappedClient { client, tap } = conn;
    let tx = begin_in(client, ticket).await?;
    let capacity = slot_capacity(limit, expected);
    let sink = Arc::new(Mutex::new(CopyDecoder::new(
        SELECT_OP,
        Slots::with_capacity(capacity),
    )));
    copy_to_sink(&tx, tap, SELECT_OP, &query, &sink).await?;
    timed(TIMEOUT, "end the pass's selection", tx.commit()).await?;
    let mut sink = copy_tap::lock(&sink);
    sink.end_stream()?;
    Ok(std::mem::take(&mut sink.into.slots))
}

/// Selects up to `limit` dirty slots of `schema_id`, in any order, on `readers` at once (one
/// per range of `ranges`), each in the exported snapshot of its ticket and over its range of
/// `change_log`'s heap pages ([`TableShape::slot_ranges`]), and returns them sorted by row id. A pass that
/// takes every dirty slot then waits for the slowest share instead of one scan of the whole
/// table, with the other cores idle (docs/design.md §4.1, "Heap passes"). Each share is
/// sorted where it was read (blocking, on its own thread) and the sorted shares are merged.
/// More than `limit` slots may come back (each share may hold `limit`): the caller keeps the
/// first `limit`.
pub async fn dirty_slots_split(
    readers: &mut [TappedClient],
    tickets: Vec<SnapshotTicket>,
    tables: &Tables,
    schema_id: i16,
    limit: i64,
    ranges: &[String],
    expected: u64,
) -> Result<Vec<PassSlot>> {
    if readers.len() != tickets.len() || ranges.len() > readers.len() || ranges.is_empty() {
        return Err(Error::Invariant(format!(
            "a split selection of {} readers, {} snapshot tickets and {} page ranges",
            readers.len(),
            tickets.len(),
            ranges.len()
        )));
    }
    // A reader without a range drops its ticket unused.
    let share = expected.div_ceil(ranges.len() as u64);
    let shares =
        readers
            .iter_mut()
            .zip(tickets)
            .zip(ranges)
            .map(|((conn, ticket), pages)| async move {
                let mut slots = dirty_slots_in(
                    conn,
                    ticket,
                    tables,
                    schema_id,
                    limit,
                    false,
                    Some(pages),
                    share,
                )
                .await?;
                tokio::task::spawn_blocking(move || {
                    slots.sort_unstable_by_key(|s| s.slot.row_id);
                    slots
                })
                .await
                .map_err(Error::task("sort a pass's selection"))
            });
    let shares = futures::future::try_join_all(shares).await?;
    let mut slots = Vec::with_capacity(shares.iter().map(Vec::len).sum());
    for share in shares {
        slots.extend(share);
    }
    // Sorted runs, one per share: the stable sort finds them and merges them in one pass.
    tokio::task::spawn_blocking(move || {
        slots.sort_by_key(|s| s.slot.row_id);
        slots
    })
    .await
    .map_err(Error::task("merge a pass's selection"))
}

const SELECT_OP: &str = "select a pass's dirty slots";

/// The slots a selection of at most `limit` makes room for: the `expected` ones and an eighth
/// more, at most `limit`.
fn slot_capacity(limit: i64, expected: u64) -> usize {
    let limit = u64::try_from(limit).unwrap_or(0);
    let room = expected.saturating_add(expected / 8).min(limit);
    usize::try_from(room).unwrap_or(0)
}

/// A pass's selection (`row_id, changed_at, deleted_at, ctid`), each tuple decoded into a
/// [`PassSlot`] where it lies.
struct Slots {
    fields: Vec<Option<Range<usize>>>,
    slots: Vec<PassSlot>,
}

impl Slots {
    fn with_capacity(capacity: usize) -> Self {
        Self {
            fields: Vec::with_capacity(4),
            slots: Vec::with_capacity(capacity),
        }
    }
}

impl Tuples for Slots {
    fn take(&mut self, op: &'static str, data: &[u8]) -> Result<Taken> {
        let slots = &mut self.slots;
        take_each(op, data, 4, &mut self.fields, |tuple, fields| {
            slots.push(pass_slot(tuple, fields)?);
            Ok(())
        })
    }
}

/// The slot of `tuple`, whose fields lie at `fields`.
fn pass_slot(tuple: &[u8], fields: &[Option<Range<usize>>]) -> Result<PassSlot> {
    let field = |i: usize| fields.get(i).cloned().flatten().and_then(|r| tuple.get(r));
    let bigint = |i: usize| {
        field(i)
            .map(|b| <[u8; 8]>::try_from(b).map(i64::from_be_bytes))
            .transpose()
            .map_err(|_| Error::decode(SELECT_OP, "a bigint that is not 8 bytes"))
    };
    let row_id = field(0)
        .and_then(|b| Uuid::from_slice(b).ok())
        .ok_or_else(|| Error::decode(SELECT_OP, "a row id that is not 16 bytes"))?;
    let changed_at = bigint(1)?.ok_or_else(|| Error::decode(SELECT_OP, "a NULL changed_at"))?;
    let tid = field(3)
        .and_then(Tid::from_binary)
        .ok_or_else(|| Error::decode(SELECT_OP, "a ctid that is not 6 bytes"))?;
    Ok(PassSlot {
        slot: Selected {
            row_id,
            changed_at,
            tid,
        },
        deleted_at: bigint(2)?,
    })
}

/// The `change_log` batch of `slots` (`row_id, changed_at, deleted_at`), as a batch read
/// returns it.
pub fn change_log_of(slots: &[PassSlot]) -> Result<RecordBatch> {
    let mut b = BatchBuilder::new(&change_log::COLUMNS, slots.len());
    for s in slots {
        b.builders[0].push_binary(Some(s.slot.row_id.as_bytes()))?;
        b.builders[1].push_binary(Some(&s.slot.changed_at.to_be_bytes()))?;
        let deleted = s.deleted_at.map(i64::to_be_bytes);
        b.builders[2].push_binary(deleted.as_ref().map(|d| &d[..]))?;
    }
    b.finish()
}

/// `ctid` conditions splitting a table of `pages` pages and `tuples` rows into ranges of
/// about `chunk_rows` rows; the last range is open-ended, so together they cover every page
/// the table has when it is read (a row any snapshot sees lies on one).
pub(super) fn page_ranges(pages: i64, tuples: f64, chunk_rows: f64) -> Vec<String> {
    let step = if tuples > 0.0 {
        ((pages as f64) * chunk_rows / tuples).ceil().max(1.0) as i64
    } else {
        pages.max(1)
    };
    let mut ranges = Vec::new();
    let mut start = 0i64;
    while start + step < pages {
        ranges.push(format!(
            "ctid >= '({start},0)'::tid AND ctid < '({},0)'::tid",
            start + step
        ));
        start += step;
    }
    ranges.push(format!("ctid >= '({start},0)'::tid"));
    ranges
}

/// A page sample of the schema's live row ids (`TABLESAMPLE SYSTEM`: whole heap pages, cheap
/// whatever the table's size), large enough to cut about `buckets` buckets of similar size,
/// sorted, and the percentage of the table's pages it read.
async fn sample_ids(
    client: &Client,
    tables: &Tables,
    schema_id: i16,
    buckets: usize,
    tuples: f64,
) -> Result<(Vec<u128>, f64)> {
    let want = (buckets as f64 * SAMPLE_PER_BUCKET).max(MIN_SAMPLE);
    let pct = if tuples > 0.0 {
        (100.0 * want / tuples).clamp(0.001, 100.0)
    } else {
        100.0
    };
    let sql = format!(
        "SELECT ltbase_row_id FROM {} TABLESAMPLE SYSTEM ({pct:.6}) REPEATABLE (462) \
         WHERE ltbase_schema_id = $1 AND ltbase_deleted_at IS NULL",
        tables.entity.quoted()
    );
    let rows = timed(TIMEOUT, "sample row ids", client.query(&sql, &[&schema_id])).await?;
    let mut ids: Vec<u128> = rows
        .iter()
        .map(|r| r.try_get::<_, Uuid>(0).map(|u| u.as_u128()))
        .collect::<std::result::Result<_, _>>()
        .map_err(Error::postgres("read the sampled row ids"))?;
    ids.sort_unstable();
    Ok((ids, pct))
}

/// Cuts at the `i/buckets` quantiles of the sorted `ids`, strictly increasing (fewer when the
/// sample is too small to tell them apart).
fn quantile_cuts(ids: &[u128], buckets: usize) -> Vec<u128> {
    if ids.is_empty() {
        return Vec::new();
    }
    let mut cuts: Vec<u128> = (1..buckets).map(|i| ids[i * ids.len() / buckets]).collect();
    cuts.dedup();
    cuts.retain(|c| *c > 0);
    cuts
}

/// One reader's tuples of one table, bucket by bucket, in an append-only scratch file: each
/// bucket's tuples are buffered and appended as a chunk when the buffer fills.
struct Spill {
    path: PathBuf,
    file: Piecewise<File>,
    len: u64,
    /// Per bucket: its chunks (offset, length) in the file.
    chunks: Vec<Vec<(u64, usize)>>,
    bufs: Vec<Vec<u8>>,
    cap: usize,
    rows: Vec<u64>,
}

impl Spill {
    fn create(path: PathBuf, buckets: usize) -> Result<Self> {
        let file = crate::scratch::create_writer(&path).map_err(|source| Error::Io {
            op: "create a spill file",
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            path,
            file,
            len: 0,
            chunks: vec![Vec::new(); buckets],
            bufs: vec![Vec::new(); buckets],
            cap: (SPILL_BUFFERS / buckets.max(1)).clamp(64 * 1024, 1024 * 1024),
            rows: vec![0; buckets],
        })
    }

    fn io(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::Io {
            op,
            path: self.path.clone(),
            source,
        }
    }

    fn push(&mut self, bucket: usize, tuple: &[u8]) -> Result<()> {
        self.rows[bucket] += 1;
        self.bufs[bucket].extend_from_slice(tuple);
        if self.bufs[bucket].len() >= self.cap {
            self.write(bucket)?;
        }
        Ok(())
    }

    fn write(&mut self, bucket: usize) -> Result<()> {
        let n = self.bufs[bucket].len();
        if n == 0 {
            return Ok(());
        }
        let written = self.file.write_all(&self.bufs[bucket]);
        written.map_err(|source| Error::Io {
            op: "write a spill file",
            path: self.path.clone(),
            source,
        })?;
        self.chunks[bucket].push((self.len, n));
        self.len += n as u64;
        self.bufs[bucket].clear();
        Ok(())
    }

    /// Appends every buffered tuple and frees the buffers.
    fn finish(&mut self) -> Result<()> {
        for b in 0..self.bufs.len() {
            self.write(b)?;
        }
        self.bufs = Vec::new();
        self.file.flush().map_err(self.io("write a spill file"))
    }

    /// The bytes of `bucket`'s tuples.
    fn bucket_bytes(&self, bucket: usize) -> usize {
        self.chunks[bucket].iter().map(|&(_, len)| len).sum()
    }

    /// Hands the chunks of `bucket`, read back in order, to `each` (one buffer, reused).
    fn each_chunk(&self, bucket: usize, mut each: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let chunks = &self.chunks[bucket];
        if chunks.is_empty() {
            return Ok(());
        }
        let file = File::open(&self.path).map_err(self.io("open a spill file"))?;
        let mut buf = Vec::new();
        for &(offset, len) in chunks {
            buf.resize(len, 0);
            file.read_exact_at(&mut buf, offset)
                .map_err(self.io("read a spill file"))?;
            each(&buf)?;
        }
        Ok(())
    }

    /// Appends the tuples of `bucket`, read back in order, to `out`: read where they go, not
    /// through a buffer nor into zeroed memory (a pass reads back hundreds of megabytes of
    /// entity tuples).
    fn append_bucket(&self, bucket: usize, out: &mut Vec<u8>) -> Result<()> {
        let chunks = &self.chunks[bucket];
        if chunks.is_empty() {
            return Ok(());
        }
        let mut file = File::open(&self.path).map_err(self.io("open a spill file"))?;
        for &(offset, len) in chunks {
            file.seek(SeekFrom::Start(offset))
                .map_err(self.io("read a spill file"))?;
            let read = (&mut file)
                .take(len as u64)
                .read_to_end(out)
                .map_err(self.io("read a spill file"))?;
            if read != len {
                let cut = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                return Err(self.io("read a spill file")(cut));
            }
        }
        Ok(())
    }

    /// The tuples of `bucket`, read back.
    #[cfg(test)]
    fn bucket(&self, bucket: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.append_bucket(bucket, &mut out)?;
        Ok(out)
    }
}

impl Drop for Spill {
    /// A spill file is the run's scratch: it goes with its bucket index, on success or failure.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A binary COPY stream's tuples routed by their first field (the row id) into a [`Spill`]:
/// what a reader's connection tap feeds, or the reader itself when it has no tap.
type Router = CopyDecoder<Routing>;

/// Where a reader's tuples go: the bucket of their row id, in its spill file.
struct Routing {
    buckets: Buckets,
    fields: usize,
    spill: Spill,
}

impl Tuples for Routing {
    /// Routes the complete tuples at the front of `data`. Only a tuple's length and its first
    /// field are looked at: the values are decoded when the bucket is loaded.
    fn take(&mut self, op: &'static str, data: &[u8]) -> Result<Taken> {
        let mut taken = Taken::default();
        loop {
            let t = &data[taken.used..];
            let Some(count) = t.get(..2).map(|b| i16::from_be_bytes([b[0], b[1]])) else {
                return Ok(taken);
            };
            if count == -1 {
                taken.used += 2;
                taken.end = true;
                return Ok(taken);
            }
            if usize::try_from(count).ok() != Some(self.fields) {
                return Err(Error::decode(op, "a malformed tuple: field count"));
            }
            // The row id: a 16-byte first field.
            match t.get(2..6) {
                None => return Ok(taken),
                Some(len) if len != 16i32.to_be_bytes() => {
                    return Err(Error::decode(op, "a row id that is not 16 bytes"));
                }
                Some(_) => {}
            }
            let Some(id) = t.get(6..22) else {
                return Ok(taken);
            };
            let id = u128::from_be_bytes(<[u8; 16]>::try_from(id).unwrap_or_default());
            let mut at = 22;
            for _ in 1..self.fields {
                let Some(len) = t.get(at..at + 4) else {
                    return Ok(taken);
                };
                let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
                at += 4 + usize::try_from(len).unwrap_or(0);
            }
            if t.len() < at {
                return Ok(taken);
            }
            self.spill.push(self.buckets.of(id), &t[..at])?;
            taken.used += at;
            taken.tuples += 1;
        }
    }
}

/// Runs the binary `COPY (query) TO STDOUT` and routes its tuples with `router`.
async fn copy_routed(
    tx: &Transaction<'_>,
    tap: &CopyTap,
    router: &Arc<Mutex<Router>>,
    query: &str,
) -> Result<()> {
    let op = copy_tap::lock(router).op();
    copy_to_sink(tx, tap, op, query, router).await?;
    copy_tap::lock(router).end_stream().map(drop)
}

/// Every reader's spilled tuples, by bucket: what [`read_buckets`] read.
pub struct Spilled {
    entity: Vec<Spill>,
    eav: Vec<Spill>,
    bound: Vec<(String, SlotType)>,
}

impl Spilled {
    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.entity.first().map_or(0, |s| s.rows.len())
    }

    /// Bytes of scratch disk the spill files take.
    pub fn bytes(&self) -> u64 {
        self.entity.iter().chain(&self.eav).map(|s| s.len).sum()
    }

    /// Bucket `bucket`'s live entities sorted by row id, with their EAV rows, as one page;
    /// `None` when it holds no entity. Reads its scratch files (blocking). The entity tuples
    /// are read whole, ordered by row id and decoded in that order (the columns are built once,
    /// already sorted); the EAV tuples, which need no order, are decoded chunk by chunk.
    pub fn load(&self, bucket: usize) -> Result<Option<LivePage>> {
        const OP: &str = "read back a spill file";
        let rows: u64 = self.entity.iter().map(|s| s.rows[bucket]).sum();
        if rows == 0 {
            return Ok(None);
        }
        // Sized once: grown chunk by chunk, the buffer would be copied as it doubles.
        let mut raw = Vec::with_capacity(self.entity.iter().map(|s| s.bucket_bytes(bucket)).sum());
        for s in &self.entity {
            s.append_bucket(bucket, &mut raw)?;
        }
        let fields = 4 + self.bound.len();
        let mut order: Vec<(u128, usize, usize)> = Vec::with_capacity(rows as usize);
        let mut ranges = Vec::with_capacity(fields);
        let mut at = 0;
        while at < raw.len() {
            let Some(CopyItem::Tuple(len)) = copy_tuple(OP, &raw[at..], fields, &mut ranges)?
            else {
                return Err(Error::decode(OP, "a spilled tuple is cut short"));
            };
            let id = ranges[0]
                .clone()
                .and_then(|r| <[u8; 16]>::try_from(&raw[at..][r]).ok())
                .ok_or_else(|| Error::decode(OP, "a row id that is not 16 bytes"))?;
            order.push((u128::from_be_bytes(id), at, at + len));
            at += len;
        }
        order.sort_unstable_by_key(|t| t.0);
        let mut entities = BatchBuilder::entities(&self.bound, order.len());
        for &(_, from, to) in &order {
            let taken = decode_tuples(OP, &raw[from..to], &mut entities)?;
            if (taken.used, taken.tuples) != (to - from, 1) {
                return Err(Error::decode(OP, "a spilled tuple did not decode whole"));
            }
        }
        drop(raw);
        let eav_rows: u64 = self.eav.iter().map(|s| s.rows[bucket]).sum();
        let mut eav = BatchBuilder::eav(usize::try_from(eav_rows).unwrap_or(0));
        for s in &self.eav {
            s.each_chunk(bucket, |data| {
                let taken = decode_tuples(OP, data, &mut eav)?;
                if taken.used != data.len() || taken.end {
                    return Err(Error::decode(OP, "a spilled chunk is not whole tuples"));
                }
                Ok(())
            })?;
        }
        let (first, last) = match (order.first(), order.last()) {
            (Some(f), Some(l)) => (Uuid::from_u128(f.0), Uuid::from_u128(l.0)),
            _ => return Err(Error::Invariant("a loaded bucket has no row ids".into())),
        };
        let entities = entities.finish()?;
        Ok(Some(LivePage {
            rows: entities.num_rows(),
            entities,
            eav: eav.finish()?,
            first,
            last,
        }))
    }
}

/// Opens and tunes `n` tapped connections for [`read_buckets`]. A reader opens its session
/// before the snapshot is exported, so that a connection limit is met before anything is read
/// (a flush then reads by windows instead, docs/design.md §4.1).
pub async fn open_readers(connector: &Connector, n: usize) -> Result<Vec<TappedClient>> {
    // At once: each session's handshake (TLS, authentication, the server's fork) is a few
    // round trips of waiting.
    futures::future::try_join_all((0..n).map(|_| async {
        let conn = connector.connect_tapped().await?;
        tune_for_pages(&conn.client).await?;
        Ok::<_, Error>(conn)
    }))
    .await
}

/// Reads the schema's live entities and their EAV rows by `plan`'s page ranges, on the
/// `readers` ([`open_readers`]), each in the exported snapshot of its ticket (one ticket per
/// reader), routing the tuples into buckets spilled to files in `dir`. `after_chunk` runs after
/// each range a reader has read (an error stops the read).
#[allow(clippy::too_many_arguments)]
pub async fn read_buckets<F, Fut>(
    readers: Vec<TappedClient>,
    tickets: Vec<SnapshotTicket>,
    tables: &Tables,
    schema: &SchemaDef,
    schema_id: i16,
    plan: &HeapPlan,
    dir: &Path,
    after_chunk: F,
) -> Result<Spilled>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let bound = bound_columns(schema);
    let select_cols: String = bound.iter().map(|(c, _)| format!(", {c}")).collect();
    let live = match plan.live_only {
        true => " AND ltbase_deleted_at IS NULL",
        false => "",
    };
    let entity_sql = |range: &String| {
        format!(
            "SELECT ltbase_row_id, ltbase_created_at, ltbase_updated_at, ltbase_deleted_at{select_cols} \
             FROM {} WHERE {range} AND ltbase_schema_id = {schema_id}{live}",
            tables.entity.quoted()
        )
    };
    if readers.len() != tickets.len() || readers.is_empty() {
        return Err(Error::Invariant(format!(
            "a heap read of {} readers with {} snapshot tickets",
            readers.len(),
            tickets.len()
        )));
    }
    let eav_select = eav_select(&readers[0].client, tables, schema).await?;
    let eav_sql =
        |range: &String| format!("{eav_select} WHERE {range} AND schema_id = {schema_id}");
    let n = readers.len();
    let buckets = plan.buckets();
    let router = |op, fields, path| -> Result<Arc<Mutex<Router>>> {
        Ok(Arc::new(Mutex::new(CopyDecoder::new(
            op,
            Routing {
                buckets: Buckets::new(plan.cuts.clone()),
                fields,
                spill: Spill::create(path, buckets)?,
            },
        ))))
    };
    // Every chunk's statement, the entity table's first; each reader takes the next one not
    // yet taken, so a reader that falls behind (its server process or its decoding given less
    // of the CPU) leaves the rest to the others instead of ending the read alone.
    let chunks: Arc<Vec<(bool, String)>> = Arc::new(
        (plan.entity_chunks.iter().map(|r| (true, entity_sql(r))))
            .chain(plan.eav_chunks.iter().map(|r| (false, eav_sql(r))))
            .collect(),
    );
    let next_chunk = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reads = readers
        .into_iter()
        .zip(tickets)
        .enumerate()
        .map(|(k, (mut conn, ticket))| {
            let (chunks, next_chunk) = (chunks.clone(), next_chunk.clone());
            let routers = (
                router(
                    "read entity heap range",
                    4 + bound.len(),
                    dir.join(format!("heap-{schema_id}-{k}-entity")),
                ),
                router(
                    "read eav heap range",
                    5,
                    dir.join(format!("heap-{schema_id}-{k}-eav")),
                ),
            );
            let after_chunk = after_chunk.clone();
            async move {
                let (entity, eav) = (routers.0?, routers.1?);
                let TappedClient { client, tap } = &mut conn;
                let tx = begin_in(client, ticket).await?;
                while let Some((is_entity, q)) =
                    chunks.get(next_chunk.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    let router = if *is_entity { &entity } else { &eav };
                    copy_routed(&tx, tap, router, q).await?;
                    after_chunk().await?;
                }
                timed(TIMEOUT, "end reader snapshot", tx.commit()).await?;
                let take = |r: Arc<Mutex<Router>>| -> Result<Spill> {
                    let mut r = Arc::try_unwrap(r)
                        .map_err(|_| Error::Invariant("a spill router is still shared".into()))?
                        .into_inner()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    r.into.spill.finish()?;
                    Ok(r.into.spill)
                };
                Ok::<_, Error>((take(entity)?, take(eav)?))
            }
        });
    // Each reader is a task of its own: a reader that panics fails the read (and dropping the
    // set aborts the others).
    let mut set = tokio::task::JoinSet::new();
    let mut spills: Vec<Option<(Spill, Spill)>> = (0..n).map(|_| None).collect();
    for (k, read) in reads.enumerate() {
        set.spawn(async move { (k, read.await) });
    }
    while let Some(done) = set.join_next().await {
        let (k, read) = done.map_err(Error::task("heap range reader"))?;
        spills[k] = Some(read?);
    }
    let (entity, eav) = spills.into_iter().flatten().unzip();
    Ok(Spilled { entity, eav, bound })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::copy_tap::CopySink;

    #[test]
    fn a_selection_makes_room_for_the_slots_it_expects() {
        assert_eq!(slot_capacity(2_000_000, 300_000), 337_500);
        assert_eq!(slot_capacity(1_000, 300_000), 1_000);
        assert_eq!(slot_capacity(2_000_000, 0), 0);
        assert_eq!(slot_capacity(-1, 10), 0);
    }

    #[test]
    fn quantile_cuts_split_a_sample_evenly_and_strictly() {
        let ids: Vec<u128> = (1..=1000).collect();
        assert_eq!(quantile_cuts(&ids, 4), vec![251, 501, 751]);
        assert_eq!(quantile_cuts(&[5, 5, 5, 5], 4), vec![5]);
        assert!(quantile_cuts(&[], 4).is_empty());
        assert_eq!(bucket_of(&[251, 501, 751], 250), 0);
        assert_eq!(bucket_of(&[251, 501, 751], 251), 1);
        assert_eq!(bucket_of(&[251, 501, 751], u128::MAX), 3);
    }

    #[test]
    fn the_prefix_lookup_finds_the_bucket_a_search_of_every_cut_finds() {
        let prefix = |p: u128| p << (128 - PREFIX_BITS);
        let mut x = 0x2545_f491_4f6c_dd1du128;
        let mut random = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let sorted = |n: usize, f: &mut dyn FnMut() -> u128| {
            let mut c: Vec<u128> = (0..n).map(|_| f()).collect();
            c.sort_unstable();
            c.dedup();
            c
        };
        let cut_sets: Vec<Vec<u128>> = vec![
            Vec::new(),
            vec![1],
            vec![u128::MAX],
            // Cuts on, just below and just above prefix boundaries, several in one prefix.
            vec![
                prefix(1) - 1,
                prefix(1),
                prefix(1) + 1,
                prefix(7),
                prefix(4095),
            ],
            // Uniform ids (UUIDv4), and ids that share their top bits (UUIDv7: one prefix).
            sorted(99, &mut random),
            sorted(99, &mut || prefix(0x018) | (random() >> PREFIX_BITS)),
        ];
        for cuts in cut_sets {
            let buckets = Buckets::new(cuts.clone().into());
            let mut ids: Vec<u128> = vec![0, u128::MAX, prefix(4095), prefix(1) - 1];
            for c in &cuts {
                ids.extend([c.wrapping_sub(1), *c, c.wrapping_add(1)]);
            }
            ids.extend((0..10_000).map(|_| random()));
            ids.extend((0..1_000).map(|_| prefix(0x018) | (random() >> PREFIX_BITS)));
            for id in ids {
                assert_eq!(
                    buckets.of(id),
                    bucket_of(&cuts, id),
                    "id {id:#x}, cuts {cuts:x?}"
                );
            }
        }
    }

    #[test]
    fn auto_reads_large_schemas_of_scattered_ids_in_heap_order() {
        // Random ids (correlation near 0), time-ordered ones (near 1), no statistics.
        assert!(auto_heap(Some(0.01), 1e6, 1e6));
        assert!(auto_heap(Some(-0.5), 1e6, 3e5));
        assert!(!auto_heap(Some(0.995), 1e6, 1e6));
        assert!(!auto_heap(Some(-0.95), 1e6, 1e6));
        assert!(!auto_heap(None, 1e6, 1e6));
        // A small schema, or a small share of a large table: index reads.
        assert!(!auto_heap(Some(0.0), 5e4, 5e4));
        assert!(!auto_heap(Some(0.0), 1e7, 1e6));
    }

    #[test]
    fn a_split_selection_covers_every_page_once() {
        let shape = |log_pages| {
            TableShape(Sizes {
                entity_pages: 0,
                entity_tuples: 0.0,
                entity_bytes: 0.0,
                eav_pages: 0,
                eav_tuples: 0.0,
                eav_bytes: 0.0,
                log_pages,
                correlation: None,
            })
        };
        assert_eq!(shape(500).slot_ranges(1), vec!["ctid >= '(0,0)'::tid"]);
        assert_eq!(
            shape(500).slot_ranges(2),
            vec![
                "ctid >= '(0,0)'::tid AND ctid < '(250,0)'::tid",
                "ctid >= '(250,0)'::tid",
            ]
        );
        assert_eq!(
            shape(10).slot_ranges(3),
            vec![
                "ctid >= '(0,0)'::tid AND ctid < '(4,0)'::tid",
                "ctid >= '(4,0)'::tid AND ctid < '(8,0)'::tid",
                "ctid >= '(8,0)'::tid",
            ]
        );
        // A table of one page (or none, or never measured): one range, every page it has by
        // the time it is read; the selection then runs on one reader.
        assert_eq!(shape(1).slot_ranges(2), vec!["ctid >= '(0,0)'::tid"]);
        assert_eq!(shape(0).slot_ranges(2), vec!["ctid >= '(0,0)'::tid"]);
    }

    #[test]
    fn a_flush_pass_reads_the_heap_for_a_large_share_of_scattered_ids() {
        let shape = |correlation| {
            TableShape(Sizes {
                entity_pages: 1000,
                entity_tuples: 1e6,
                entity_bytes: 8e6,
                eav_pages: 4000,
                eav_tuples: 4e6,
                eav_bytes: 3.2e7,
                log_pages: 500,
                correlation,
            })
        };
        let (random, ordered) = (shape(Some(0.002)), shape(Some(0.999)));
        assert!(random.heap_pass(ReadOrder::Auto, 1_000_000));
        assert!(random.heap_pass(ReadOrder::Auto, 250_000));
        // Under a quarter of the table: lookups read less than the scan would.
        assert!(!random.heap_pass(ReadOrder::Auto, 249_999));
        // Time-ordered ids are read by ranges; no statistics, no scan.
        assert!(!ordered.heap_pass(ReadOrder::Auto, 1_000_000));
        assert!(!shape(None).heap_pass(ReadOrder::Auto, 1_000_000));
        // The setting wins either way.
        assert!(ordered.heap_pass(ReadOrder::Heap, 1));
        assert!(!random.heap_pass(ReadOrder::RowId, 1_000_000));
        let plan = random.pass_plan(vec![10, 20], 500_000);
        assert_eq!(plan.buckets(), 3);
        assert!(!plan.live_only, "a pass reads deleted entities' rows too");
        assert_eq!((plan.entity_chunks.len(), plan.eav_chunks.len()), (2, 8));
    }

    #[test]
    fn a_sampled_correlation_tells_ordered_ids_from_random_ones() {
        let at = |i: u128| ((i as i64 / 40, i as i64 % 40), i);
        let ordered: Vec<_> = (0..4000u128).map(at).collect();
        let c = rank_correlation(ordered).unwrap();
        assert!((c - 1.0).abs() < 1e-9, "{c}");
        let reversed: Vec<_> = (0..4000u128).map(|i| (at(i).0, 4000 - i)).collect();
        let c = rank_correlation(reversed).unwrap();
        assert!((c + 1.0).abs() < 1e-9, "{c}");
        // UUIDv4-like ids: a random permutation's rank correlation is about 0 (sd 1/sqrt(n)).
        let random: Vec<_> = (0..4000u128)
            .map(|i| (at(i).0, Uuid::new_v4().as_u128()))
            .collect();
        let c = rank_correlation(random).unwrap();
        assert!(c.abs() < 0.1, "{c}");
        assert!(auto_heap(Some(c), 1e6, 1e6));
        assert_eq!(rank_correlation(vec![at(1)]), None);
        assert_eq!(stats_sample_pct(30), 100.0);
        assert_eq!(stats_sample_pct(30_000), 1.0);
    }

    #[test]
    fn page_ranges_cover_every_page_and_end_open() {
        assert_eq!(
            page_ranges(10, 1000.0, 300.0),
            vec![
                "ctid >= '(0,0)'::tid AND ctid < '(3,0)'::tid",
                "ctid >= '(3,0)'::tid AND ctid < '(6,0)'::tid",
                "ctid >= '(6,0)'::tid AND ctid < '(9,0)'::tid",
                "ctid >= '(9,0)'::tid",
            ]
        );
        assert_eq!(page_ranges(0, 0.0, 300.0), vec!["ctid >= '(0,0)'::tid"]);
    }

    #[test]
    fn a_pass_selection_decodes_slots_across_split_messages() {
        let field = |t: &mut Vec<u8>, v: Option<&[u8]>| match v {
            Some(v) => {
                t.extend((v.len() as i32).to_be_bytes());
                t.extend(v);
            }
            None => t.extend((-1i32).to_be_bytes()),
        };
        let tuple = |id: u128, changed: i64, deleted: Option<i64>, block: u32, offset: u16| {
            let mut t = 4i16.to_be_bytes().to_vec();
            field(&mut t, Some(&id.to_be_bytes()));
            field(&mut t, Some(&changed.to_be_bytes()));
            field(
                &mut t,
                deleted.map(i64::to_be_bytes).as_ref().map(|d| &d[..]),
            );
            field(
                &mut t,
                Some(&[block.to_be_bytes().as_slice(), &offset.to_be_bytes()].concat()),
            );
            t
        };
        let mut stream = super::super::copy_decoder::COPY_SIGNATURE.to_vec();
        stream.extend([0u8; 8]);
        stream.extend(tuple(7, 1_700_000_000_001, None, 3, 12));
        stream.extend(tuple(u128::MAX - 5, -4, Some(1_800_000_000_000), 70_000, 1));
        stream.extend((-1i16).to_be_bytes());
        let tid = |block: u32, offset: u16| {
            Tid::from_binary(&[block.to_be_bytes().as_slice(), &offset.to_be_bytes()].concat())
                .unwrap()
        };
        // Every split point, two bytes at a time at worst.
        let sink = || CopyDecoder::new(SELECT_OP, Slots::with_capacity(0));
        let mut slots = sink();
        for piece in stream.chunks(2) {
            slots.copy_data(piece);
        }
        assert_eq!(slots.end_stream().unwrap(), 2);
        let slots = slots.into.slots;
        let got: Vec<_> = slots.iter().map(|s| (s.slot, s.deleted_at)).collect();
        assert_eq!(
            got,
            [
                (
                    Selected {
                        row_id: Uuid::from_u128(7),
                        changed_at: 1_700_000_000_001,
                        tid: tid(3, 12),
                    },
                    None
                ),
                (
                    Selected {
                        row_id: Uuid::from_u128(u128::MAX - 5),
                        changed_at: -4,
                        tid: tid(70_000, 1),
                    },
                    Some(1_800_000_000_000)
                ),
            ]
        );
        // A stream cut short is an error, not fewer slots.
        let mut cut = sink();
        cut.copy_data(&stream[..stream.len() - 2]);
        let e = cut.end_stream().unwrap_err().to_string();
        assert!(e.contains("ended early"), "{e}");
        // A NULL version is refused.
        let mut bad = stream[..19].to_vec();
        let mut t = 4i16.to_be_bytes().to_vec();
        field(&mut t, Some(&7u128.to_be_bytes()));
        field(&mut t, None);
        field(&mut t, None);
        field(&mut t, Some(&[0u8; 6]));
        bad.extend(t);
        bad.extend((-1i16).to_be_bytes());
        let mut null = sink();
        null.copy_data(&bad);
        let e = null.end_stream().unwrap_err().to_string();
        assert!(e.contains("NULL changed_at"), "{e}");
    }

    #[test]
    fn a_router_spills_tuples_by_bucket_across_split_messages() {
        let dir = tempfile::tempdir().unwrap();
        let tuple = |id: u128, v: &[u8]| {
            let mut t = 2i16.to_be_bytes().to_vec();
            t.extend(16i32.to_be_bytes());
            t.extend(id.to_be_bytes());
            t.extend((v.len() as i32).to_be_bytes());
            t.extend(v);
            t
        };
        let mut stream = super::super::copy_decoder::COPY_SIGNATURE.to_vec();
        stream.extend([0u8; 8]);
        let tuples = [
            tuple(7, b"a"),
            tuple(300, b"bb"),
            tuple(9, b""),
            tuple(1000, b"c"),
        ];
        for t in &tuples {
            stream.extend(t);
        }
        stream.extend((-1i16).to_be_bytes());
        let router = |name: &str| -> Router {
            CopyDecoder::new(
                "test",
                Routing {
                    buckets: Buckets::new(vec![100, 500].into()),
                    fields: 2,
                    spill: Spill::create(dir.path().join(name), 3).unwrap(),
                },
            )
        };
        let mut r = router("s");
        // Every split point, one byte at a time at worst.
        for piece in stream.chunks(3) {
            r.copy_data(piece);
        }
        assert_eq!(r.end_stream().unwrap(), 4);
        let spill = &mut r.into.spill;
        spill.finish().unwrap();
        assert_eq!(spill.rows, vec![2, 1, 1]);
        assert_eq!(
            spill.bucket(0).unwrap(),
            [&tuples[0][..], &tuples[2][..]].concat()
        );
        assert_eq!(spill.bucket(1).unwrap(), tuples[1]);
        assert_eq!(spill.bucket(2).unwrap(), tuples[3]);
        // A stream cut short is an error, not a short bucket.
        r.copy_data(&stream[..40]);
        assert!(r.end_stream().is_err());
        // A row id that is not 16 bytes is refused.
        let mut r = router("t");
        let mut bad = stream[..19].to_vec();
        bad.extend(2i16.to_be_bytes());
        bad.extend(4i32.to_be_bytes());
        bad.extend([0u8; 4]);
        bad.extend(0i32.to_be_bytes());
        bad.extend((-1i16).to_be_bytes());
        r.copy_data(&bad);
        let e = r.end_stream().unwrap_err().to_string();
        assert!(e.contains("not 16 bytes"), "{e}");
    }
}
