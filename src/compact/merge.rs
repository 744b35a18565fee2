//! The streaming k-way merge of a compaction (docs/design.md §9). Every input stream is sorted
//! by `row_id` (a lake file is; the rewritten base files of one stream have disjoint ranges
//! and follow one another), so the merge never sorts: it repeatedly takes, from the stream
//! with the smallest head, the run of rows below every other stream's head, as zero-copy
//! slices, and settles rows present in several streams by the read rule (highest
//! `changed_at`; on a tie the tombstone wins, docs/hazards.md L28). Each surviving row goes to
//! a new base when its range is rewritten (tombstones dropped: nothing below them is left) or
//! to the consolidated delta otherwise (tombstones kept: the kept base below still holds the
//! row's older copy). Memory: the current batch of each stream and the batches in flight to
//! the writer.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::SyncSender;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, new_null_array};
use arrow::compute::filter_record_batch;
use arrow::compute::{CastOptions, can_cast_types, cast_with_options, concat_batches};
use arrow::datatypes::{Field, Int64Type, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::output::{Kind, Msg};
use crate::error::{Error, Result};
use crate::lake::ranges::{Key, Ranges, key};
use crate::lake::streamed::{BATCH_ROWS, Cursor, Source};

/// Runs at least this long are sent to the writer as they are; shorter ones are gathered.
const DIRECT_RUN: usize = 512;

/// The columns of the merged files: every source's columns, in order of first appearance
/// (sources in the order given), each nullable. A column whose type differs between sources
/// takes the type of the newest source holding it (highest `created_max`), and the others are
/// cast to it; a type that cannot be cast is refused, naming the column and both files.
pub(crate) fn merged_schema(sources: &[Arc<Source>]) -> Result<SchemaRef> {
    let mut order: Vec<String> = Vec::new();
    let mut seen: HashMap<String, Vec<(Arc<Field>, &Source)>> = HashMap::new();
    for s in sources {
        for f in s.arrow.schema().fields() {
            let copies = seen.entry(f.name().clone()).or_insert_with(|| {
                order.push(f.name().clone());
                Vec::new()
            });
            copies.push((f.clone(), s.as_ref()));
        }
    }
    let mut fields = Vec::with_capacity(order.len());
    for name in order {
        let copies = &seen[&name];
        let newest = copies
            .iter()
            .max_by_key(|(_, s)| s.entry.created_max)
            .ok_or_else(|| Error::Invariant(format!("column {name} of no source")))?;
        let to = newest.0.data_type();
        for (f, s) in copies {
            if f.data_type() != to && !can_cast_types(f.data_type(), to) {
                return Err(Error::Parquet {
                    path: s.entry.path.clone(),
                    message: format!(
                        "column {name} is {} here but {to} in the newer {}: the files cannot be merged",
                        f.data_type(),
                        newest.1.entry.path
                    ),
                });
            }
        }
        fields.push(newest.0.as_ref().clone().with_nullable(true));
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// `batch` with the merged columns: a missing column is NULL, a column of another type is
/// cast, and a NULL `deleted_at` (older writers' live rows) is 0.
fn conform(src: &Source, batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let strict = CastOptions {
        safe: false,
        ..CastOptions::default()
    };
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let column = match batch.column_by_name(f.name()) {
            None => new_null_array(f.data_type(), rows),
            Some(a) if a.data_type() == f.data_type() => a.clone(),
            Some(a) => {
                cast_with_options(a, f.data_type(), &strict).map_err(|e| Error::Parquet {
                    path: src.entry.path.clone(),
                    message: format!("column {}: {e}", f.name()),
                })?
            }
        };
        let column = if f.name() == "deleted_at" && column.null_count() > 0 {
            let values = column
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| Error::Invariant("deleted_at is not BIGINT".into()))?;
            Arc::new(
                values
                    .iter()
                    .map(|v| Some(v.unwrap_or(0)))
                    .collect::<Int64Array>(),
            )
        } else {
            column
        };
        columns.push(column);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(Error::arrow("conform a merge input"))
}

/// The current batch of a stream and where the merge is in it.
struct Head {
    batch: RecordBatch,
    keys: Vec<Key>,
    changed: Vec<i64>,
    deleted: Vec<i64>,
    pos: usize,
}

impl Head {
    fn key(&self) -> Key {
        self.keys[self.pos]
    }
}

/// One input stream: its cursor, its head, and the last key it produced (to check order).
struct Stream {
    cursor: Cursor,
    head: Option<Head>,
    last: Option<Key>,
    done: bool,
}

impl Stream {
    /// Makes sure the stream has a row at its head, unless it is exhausted.
    fn fill(&mut self, schema: &SchemaRef, rows_in: &mut u64) -> Result<()> {
        while !self.done && self.head.as_ref().is_none_or(|h| h.pos >= h.keys.len()) {
            self.head = None;
            match self.cursor.next_batch()? {
                None => self.done = true,
                Some((src, raw)) => {
                    *rows_in += raw.num_rows() as u64;
                    let batch = conform(&src, &raw, schema)?;
                    let (keys, changed, deleted) = columns(&src, &batch)?;
                    let unsorted = || Error::Parquet {
                        path: src.entry.path.clone(),
                        message: "its rows are not sorted by row_id, one copy per row \
                                  (docs/design.md §3.1): not merged"
                            .into(),
                    };
                    if keys.windows(2).any(|w| w[0] >= w[1]) {
                        return Err(unsorted());
                    }
                    if let (Some(last), Some(first)) = (self.last, keys.first())
                        && *first <= last
                    {
                        return Err(unsorted());
                    }
                    self.last = keys.last().copied().or(self.last);
                    self.head = Some(Head {
                        batch,
                        keys,
                        changed,
                        deleted,
                        pos: 0,
                    });
                }
            }
        }
        Ok(())
    }
}

/// The keys, versions and tombstone markers of a conformed batch.
fn columns(src: &Source, batch: &RecordBatch) -> Result<(Vec<Key>, Vec<i64>, Vec<i64>)> {
    let bad = |m: &str| Error::Parquet {
        path: src.entry.path.clone(),
        message: m.to_string(),
    };
    let row_ids = batch
        .column_by_name("row_id")
        .and_then(|c| c.as_fixed_size_binary_opt())
        .ok_or_else(|| bad("row_id is not a UUID column"))?;
    if row_ids.null_count() > 0 {
        return Err(bad("a row has no row_id"));
    }
    let mut keys = Vec::with_capacity(row_ids.len());
    for i in 0..row_ids.len() {
        let bytes: &[u8; 16] = row_ids
            .value(i)
            .try_into()
            .map_err(|_| bad("a row_id of other than 16 bytes"))?;
        keys.push(key(bytes));
    }
    let int = |name: &str| -> Result<&arrow::array::PrimitiveArray<Int64Type>> {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| bad(&format!("{name} is not BIGINT")))
    };
    let changed = int("changed_at")?;
    if changed.null_count() > 0 {
        return Err(bad("a row has no changed_at"));
    }
    let deleted = int("deleted_at")?;
    Ok((keys, changed.values().to_vec(), deleted.values().to_vec()))
}

/// Rows gathered for one output before they are sent.
struct Pending {
    kind: Kind,
    parts: Vec<RecordBatch>,
    rows: usize,
}

/// What a merge read and wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Rows read from the sources.
    pub rows_in: u64,
    /// Rows sent to new bases.
    pub base_rows: u64,
    /// Rows sent to the consolidated delta.
    pub delta_rows: u64,
}

/// The merge of one pass.
pub(crate) struct Merge<'a> {
    ranges: &'a Ranges,
    /// Per slot of `ranges`: whether its range is rewritten.
    rewrite: &'a [bool],
    schema: SchemaRef,
    tx: SyncSender<Msg>,
    base: Pending,
    delta: Pending,
    /// The range the last base rows belonged to.
    last_range: Option<usize>,
    counts: Counts,
}

impl<'a> Merge<'a> {
    /// A merge routing rows by `ranges` and `rewrite`, writing to `tx`.
    pub(crate) fn new(
        ranges: &'a Ranges,
        rewrite: &'a [bool],
        schema: SchemaRef,
        tx: SyncSender<Msg>,
    ) -> Self {
        let pending = |kind| Pending {
            kind,
            parts: Vec::new(),
            rows: 0,
        };
        Self {
            ranges,
            rewrite,
            schema,
            tx,
            base: pending(Kind::Base),
            delta: pending(Kind::Delta),
            last_range: None,
            counts: Counts::default(),
        }
    }

    /// Merges `cursors` to the end and tells the writer it is complete (blocks: run it on a
    /// blocking thread).
    pub(crate) fn run(mut self, cursors: Vec<Cursor>, zero_row_base: bool) -> Result<Counts> {
        let mut streams: Vec<Stream> = cursors
            .into_iter()
            .map(|cursor| Stream {
                cursor,
                head: None,
                last: None,
                done: false,
            })
            .collect();
        let schema = self.schema.clone();
        for s in &mut streams {
            s.fill(&schema, &mut self.counts.rows_in)?;
        }
        loop {
            // The smallest head, and the smallest key of any other stream.
            let mut first: Option<(Key, usize)> = None;
            let mut second: Option<Key> = None;
            for (i, s) in streams.iter().enumerate() {
                let Some(h) = &s.head else { continue };
                let k = h.key();
                match first {
                    Some((f, _)) if k >= f => second = Some(second.map_or(k, |x| x.min(k))),
                    Some((f, _)) => {
                        second = Some(second.map_or(f, |x| x.min(f)));
                        first = Some((k, i));
                    }
                    None => first = Some((k, i)),
                }
            }
            let Some((k, i)) = first else { break };
            if second == Some(k) {
                self.settle(&mut streams, k)?;
                for s in &mut streams {
                    s.fill(&schema, &mut self.counts.rows_in)?;
                }
                continue;
            }
            let Some(h) = streams[i].head.as_mut() else {
                continue;
            };
            let end = match second {
                Some(limit) => h.pos + h.keys[h.pos..].partition_point(|x| *x < limit),
                None => h.keys.len(),
            };
            let (start, src_batch) = (h.pos, h.batch.clone());
            let keys = h.keys[start..end].to_vec();
            let deleted = h.deleted[start..end].to_vec();
            h.pos = end;
            self.route(&src_batch, start, &keys, &deleted)?;
            streams[i].fill(&schema, &mut self.counts.rows_in)?;
        }
        self.flush(Kind::Base)?;
        self.flush(Kind::Delta)?;
        self.send(Msg::End { zero_row_base })?;
        Ok(self.counts)
    }

    /// Settles a row present at the head of several streams: the highest `changed_at` wins, a
    /// tombstone wins a tie; every copy is consumed.
    fn settle(&mut self, streams: &mut [Stream], k: Key) -> Result<()> {
        let mut best: Option<(usize, i64, bool)> = None;
        for (i, s) in streams.iter().enumerate() {
            let Some(h) = &s.head else { continue };
            if h.key() != k {
                continue;
            }
            let (v, dead) = (h.changed[h.pos], h.deleted[h.pos] > 0);
            let wins = match best {
                None => true,
                Some((_, bv, bdead)) => v > bv || (v == bv && dead && !bdead),
            };
            if wins {
                best = Some((i, v, dead));
            }
        }
        let Some((w, _, _)) = best else {
            return Ok(());
        };
        if let Some(h) = &streams[w].head {
            let (batch, pos) = (h.batch.clone(), h.pos);
            let (key, dead) = (h.keys[pos], h.deleted[pos]);
            self.route(&batch, pos, &[key], &[dead])?;
        }
        for s in streams.iter_mut() {
            if let Some(h) = s.head.as_mut()
                && h.key() == k
            {
                h.pos += 1;
            }
        }
        Ok(())
    }

    /// Sends rows `start..start + keys.len()` of `batch` (whose keys and `deleted_at` are
    /// given) to the outputs their ranges say.
    fn route(
        &mut self,
        batch: &RecordBatch,
        start: usize,
        keys: &[Key],
        deleted: &[i64],
    ) -> Result<()> {
        let mut at = 0;
        while at < keys.len() {
            let r = self.ranges.locate(keys[at]);
            let stop = match self.ranges.end(r) {
                Some(end) => at + keys[at..].partition_point(|k| *k < end),
                None => keys.len(),
            };
            let rewrite = self.rewrite.get(r).copied().unwrap_or(false);
            let slice = batch.slice(start + at, stop - at);
            if rewrite {
                self.enter_range(r)?;
                let dead = &deleted[at..stop];
                let slice = if dead.iter().any(|d| *d > 0) {
                    let live: BooleanArray = dead.iter().map(|d| Some(*d <= 0)).collect();
                    filter_record_batch(&slice, &live).map_err(Error::arrow("drop tombstones"))?
                } else {
                    slice
                };
                self.counts.base_rows += slice.num_rows() as u64;
                self.push(Kind::Base, slice)?;
            } else {
                self.counts.delta_rows += slice.num_rows() as u64;
                self.push(Kind::Delta, slice)?;
            }
            at = stop;
        }
        Ok(())
    }

    /// Base rows of range `r` follow: a base file never spans a range that is kept.
    fn enter_range(&mut self, r: usize) -> Result<()> {
        if let Some(last) = self.last_range
            && r != last
            && (last + 1..r).any(|k| !self.rewrite.get(k).copied().unwrap_or(false))
        {
            self.flush(Kind::Base)?;
            self.send(Msg::Cut)?;
        }
        self.last_range = Some(r);
        Ok(())
    }

    fn pending(&mut self, kind: Kind) -> &mut Pending {
        match kind {
            Kind::Base => &mut self.base,
            Kind::Delta => &mut self.delta,
        }
    }

    fn push(&mut self, kind: Kind, rows: RecordBatch) -> Result<()> {
        if rows.num_rows() == 0 {
            return Ok(());
        }
        if rows.num_rows() >= DIRECT_RUN {
            self.flush(kind)?;
            return self.send(Msg::Rows(kind, rows));
        }
        let p = self.pending(kind);
        p.rows += rows.num_rows();
        p.parts.push(rows);
        if p.rows >= BATCH_ROWS {
            self.flush(kind)?;
        }
        Ok(())
    }

    /// Sends the gathered rows of `kind` as one batch.
    fn flush(&mut self, kind: Kind) -> Result<()> {
        let schema = self.schema.clone();
        let p = self.pending(kind);
        if p.parts.is_empty() {
            return Ok(());
        }
        let parts = std::mem::take(&mut p.parts);
        p.rows = 0;
        let kind = p.kind;
        let batch = concat_batches(&schema, &parts).map_err(Error::arrow("gather merged rows"))?;
        self.send(Msg::Rows(kind, batch))
    }

    fn send(&self, msg: Msg) -> Result<()> {
        self.tx
            .send(msg)
            .map_err(|_| Error::Invariant("the compaction writer stopped".into()))
    }
}
