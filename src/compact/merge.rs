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
//!
//! Rows sent to a new base say where they come from (`Span`): rows of a base row group, or a
//! newer copy that replaces one of them, with the columns where the copy differs. The writer
//! copies the unchanged columns of a row group that comes out row for row as it went in
//! (docs/design.md §9).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::SyncSender;

use arrow::array::{
    Array, ArrayData, ArrayRef, AsArray, DynComparator, Int64Array, MutableArrayData, make_array,
    make_comparator, new_null_array,
};
use arrow::compute::{CastOptions, SortOptions, can_cast_types, cast_with_options};
use arrow::datatypes::{Field, Int64Type, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::output::{Kind, Msg};
use crate::engine::parallel::{Earlier, Span, worth_repeating};
use crate::error::{Error, Result};
use crate::lake::current::supersedes;
use crate::lake::manifest::FileEntry;
use crate::lake::ranges::{Key, Ranges, key};
use crate::lake::streamed::{BATCH_ROWS, Cursor, Decoded, Source};

/// Runs at least this long are sent to the writer as they are; shorter ones are gathered.
const DIRECT_RUN: usize = 512;

/// The columns of the merged files: every source's columns, in order of first appearance
/// (sources in the order given), each nullable. A column whose type differs between sources
/// takes the type of the newest source holding it (highest `created_max`), and the others are
/// cast to it; a type that cannot be cast is refused, naming the column and both files.
pub(crate) fn merged_schema(sources: &[(FileEntry, SchemaRef)]) -> Result<SchemaRef> {
    let mut order: Vec<String> = Vec::new();
    let mut seen: HashMap<String, Vec<(Arc<Field>, &FileEntry)>> = HashMap::new();
    for (entry, schema) in sources {
        for f in schema.fields() {
            let copies = seen.entry(f.name().clone()).or_insert_with(|| {
                order.push(f.name().clone());
                Vec::new()
            });
            copies.push((f.clone(), entry));
        }
    }
    let mut fields = Vec::with_capacity(order.len());
    for name in order {
        let copies = &seen[&name];
        let newest = copies
            .iter()
            .max_by_key(|(_, e)| e.created_max)
            .ok_or_else(|| Error::Invariant(format!("column {name} of no source")))?;
        let to = newest.0.data_type();
        for (f, e) in copies {
            if f.data_type() != to && !can_cast_types(f.data_type(), to) {
                return Err(Error::Parquet {
                    path: e.path.clone(),
                    message: format!(
                        "column {name} is {} here but {to} in the newer {}: the files cannot be merged",
                        f.data_type(),
                        newest.1.path
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
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let column = match batch.column_by_name(f.name()) {
            None => new_null_array(f.data_type(), rows),
            Some(a) if a.data_type() == f.data_type() => a.clone(),
            Some(a) => retyped(a, f.data_type()).map_err(|e| Error::Parquet {
                path: src.entry.path.clone(),
                message: format!("column {}: {e}", f.name()),
            })?,
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

/// An older file's column in the newer type, as the export's `TRY_CAST` makes the source's
/// value of it (docs/hazards.md L93): a double becomes a whole number by rounding half to even,
/// and NaN, an infinity or a value out of range is NULL, as is any value the cast cannot take —
/// a strict cast failed every compaction on one NaN and cut 1.5 to 1.
fn retyped(
    a: &ArrayRef,
    to: &arrow::datatypes::DataType,
) -> Result<ArrayRef, arrow::error::ArrowError> {
    use crate::engine::writer::double_to_bigint;
    use arrow::datatypes::{DataType, Float64Type};
    if let (Some(doubles), DataType::Int64 | DataType::Int32 | DataType::Int16) =
        (a.as_primitive_opt::<Float64Type>(), to)
    {
        let whole: Int64Array = doubles
            .iter()
            .map(|v| v.and_then(double_to_bigint))
            .collect();
        let whole: ArrayRef = Arc::new(whole);
        return cast_with_options(&whole, to, &CastOptions::default());
    }
    cast_with_options(a, to, &CastOptions::default())
}

/// The current batch of a stream and where the merge is in it.
struct Head {
    /// Tells this batch from every other of the merge (a pending run points into it).
    id: u64,
    batch: RecordBatch,
    keys: Vec<Key>,
    changed: Vec<i64>,
    deleted: Vec<i64>,
    pos: usize,
    /// The base row group the batch's rows are rows `offset..` of, when a new base may
    /// repeat it.
    earlier: Option<Arc<dyn Earlier>>,
    offset: usize,
}

impl Head {
    fn key(&self) -> Key {
        self.keys[self.pos]
    }

    /// Where rows from `start` of the batch come from.
    fn from(&self, start: usize) -> Option<(Arc<dyn Earlier>, usize)> {
        self.earlier.clone().map(|e| (e, self.offset + start))
    }
}

/// One input stream: its cursor, its head, and the last key it produced (to check order).
struct Stream {
    cursor: Cursor,
    head: Option<Head>,
    last: Option<Key>,
    done: bool,
    /// The fewest rows of a base row group new bases line up with.
    min_repeat: usize,
}

impl Stream {
    /// Makes sure the stream has a row at its head, unless it is exhausted.
    fn fill(&mut self, schema: &SchemaRef, counts: &mut Counts) -> Result<()> {
        while !self.done && self.head.as_ref().is_none_or(|h| h.pos >= h.keys.len()) {
            self.head = None;
            match self.cursor.next_batch()? {
                None => self.done = true,
                Some(Decoded {
                    group,
                    offset,
                    batch: raw,
                }) => {
                    let src = &group.source;
                    counts.rows_in += raw.num_rows() as u64;
                    counts.batches += 1;
                    let batch = conform(src, &raw, schema)?;
                    let (keys, changed, deleted) = columns(src, &batch)?;
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
                    let earlier: Arc<dyn Earlier> = group.clone();
                    self.head = Some(Head {
                        id: counts.batches,
                        batch,
                        keys,
                        changed,
                        deleted,
                        pos: 0,
                        earlier: worth_repeating(earlier.as_ref(), self.min_repeat)
                            .then_some(earlier),
                        offset,
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

/// Whether `next` continues `last`: the next rows of the same row group, neither a copy that
/// replaces one.
fn continues(last: &Span, next: &Span) -> bool {
    match (&last.from, &next.from) {
        (Some((a, p)), Some((b, q))) => {
            Arc::ptr_eq(a, b)
                && p + last.len == *q
                && last.changed.is_empty()
                && next.changed.is_empty()
        }
        (None, None) => true,
        _ => false,
    }
}

/// Rows gathered for one output before they are sent: runs of rows of the batches they come
/// from, copied into one batch at once (a slice per run would cost an allocation per column).
struct Pending {
    kind: Kind,
    /// The batches the runs point into, with their [`Head::id`].
    batches: Vec<(u64, RecordBatch)>,
    /// (index into `batches`, first row, rows).
    runs: Vec<(usize, usize, usize)>,
    /// Where the runs' rows come from (new bases only).
    spans: Vec<Span>,
    rows: usize,
}

/// What a merge read and wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Rows read from the sources.
    pub rows_in: u64,
    /// Batches decoded.
    pub batches: u64,
}

/// The merge of one pass.
pub(crate) struct Merge<'a> {
    ranges: &'a Ranges,
    /// Per slot of `ranges`: whether its range is rewritten.
    rewrite: &'a [bool],
    /// The fewest rows of a base row group new bases line up with, to copy its unchanged
    /// columns ([`worth_repeating`]).
    min_repeat: usize,
    schema: SchemaRef,
    tx: SyncSender<Msg>,
    base: Pending,
    delta: Pending,
    /// The range the last base rows belonged to.
    last_range: Option<usize>,
    counts: Counts,
    /// Per column, a comparison of a row of one batch with a row of another: of the batches
    /// with these [`Head::id`]s.
    diff: Option<Diff>,
}

/// Column comparisons between rows of two batches (by their [`Head::id`]s).
struct Diff {
    ids: (u64, u64),
    columns: Vec<Option<DynComparator>>,
}

impl<'a> Merge<'a> {
    /// A merge routing rows by `ranges` and `rewrite`, writing to `tx`; new bases line up
    /// with base row groups of at least `min_repeat` rows.
    pub(crate) fn new(
        ranges: &'a Ranges,
        rewrite: &'a [bool],
        min_repeat: usize,
        schema: SchemaRef,
        tx: SyncSender<Msg>,
    ) -> Self {
        let pending = |kind| Pending {
            kind,
            batches: Vec::new(),
            runs: Vec::new(),
            spans: Vec::new(),
            rows: 0,
        };
        Self {
            ranges,
            rewrite,
            min_repeat,
            schema,
            tx,
            base: pending(Kind::Base),
            delta: pending(Kind::Delta),
            last_range: None,
            counts: Counts::default(),
            diff: None,
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
                min_repeat: self.min_repeat,
            })
            .collect();
        let schema = self.schema.clone();
        for s in &mut streams {
            s.fill(&schema, &mut self.counts)?;
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
                    s.fill(&schema, &mut self.counts)?;
                }
                continue;
            }
            let stream = &mut streams[i];
            let Some(h) = stream.head.as_ref() else {
                continue;
            };
            let start = h.pos;
            let end = match second {
                Some(limit) => start + h.keys[start..].partition_point(|x| *x < limit),
                None => h.keys.len(),
            };
            self.route(h, start, end, None)?;
            if let Some(h) = stream.head.as_mut() {
                h.pos = end;
            }
            stream.fill(&schema, &mut self.counts)?;
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
            let wins = best.is_none_or(|(_, bv, bdead)| supersedes(v, dead, (bv, bdead)));
            if wins {
                best = Some((i, v, dead));
            }
        }
        let Some((w, _, dead)) = best else {
            return Ok(());
        };
        // A live copy that replaces a row of a base row group a new base may repeat.
        let replaced = streams
            .iter()
            .enumerate()
            .find(|(i, s)| {
                *i != w
                    && s.head
                        .as_ref()
                        .is_some_and(|h| h.key() == k && h.earlier.is_some())
            })
            .map(|(i, _)| i)
            .filter(|_| !dead);
        if let Some(h) = &streams[w].head {
            let replaces = match replaced.and_then(|b| streams[b].head.as_ref()) {
                Some(b) => b.from(b.pos).map(|from| Span {
                    len: 1,
                    from: Some(from),
                    changed: self.differing(h, b),
                }),
                None => None,
            };
            self.route(h, h.pos, h.pos + 1, replaces)?;
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

    /// The columns where row `w.pos` of `w`'s batch differs from row `b.pos` of `b`'s.
    fn differing(&mut self, w: &Head, b: &Head) -> Vec<usize> {
        if self.diff.as_ref().is_none_or(|d| d.ids != (w.id, b.id)) {
            let columns = (0..w.batch.num_columns())
                .map(|c| {
                    make_comparator(
                        w.batch.column(c).as_ref(),
                        b.batch.column(c).as_ref(),
                        SortOptions::default(),
                    )
                    .ok()
                })
                .collect();
            self.diff = Some(Diff {
                ids: (w.id, b.id),
                columns,
            });
        }
        let Some(diff) = &self.diff else {
            return (0..w.batch.num_columns()).collect();
        };
        diff.columns
            .iter()
            .enumerate()
            .filter(|(_, cmp)| cmp.as_ref().is_none_or(|f| !f(w.pos, b.pos).is_eq()))
            .map(|(c, _)| c)
            .collect()
    }

    /// Sends rows `start..end` of `h`'s batch to the outputs their ranges say: a rewritten
    /// range's to the new bases without tombstones, any other's to the consolidated delta.
    /// With `replaces`, the one row is a newer copy of a base row group's row (where from,
    /// and the columns that differ).
    fn route(&mut self, h: &Head, start: usize, end: usize, replaces: Option<Span>) -> Result<()> {
        let mut replaces = replaces;
        let mut at = start;
        while at < end {
            let r = self.ranges.locate(h.keys[at]);
            let stop = match self.ranges.end(r) {
                Some(bound) => at + h.keys[at..end].partition_point(|k| *k < bound),
                None => end,
            };
            if self.rewrite.get(r).copied().unwrap_or(false) {
                self.enter_range(r)?;
                // The live rows, run by run.
                let mut from = at;
                while from < stop {
                    let live = h.deleted[from..stop]
                        .iter()
                        .position(|d| *d > 0)
                        .map_or(stop, |n| from + n);
                    if live > from {
                        let span = match replaces.take() {
                            Some(span) => span,
                            None => Span {
                                len: 0,
                                from: h.from(from),
                                changed: Vec::new(),
                            },
                        };
                        self.push(Kind::Base, h, from, live - from, span)?;
                    }
                    from = live + 1;
                }
            } else {
                self.push(Kind::Delta, h, at, stop - at, Span::fresh(0))?;
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

    /// Queues `len` rows of `h`'s batch from `start` for `kind`, from where `span` says (its
    /// length is set here): a long run is sent as it is (a zero-copy slice), short ones are
    /// gathered.
    fn push(&mut self, kind: Kind, h: &Head, start: usize, len: usize, span: Span) -> Result<()> {
        let span = Span { len, ..span };
        let spans = |span: Span| match kind {
            Kind::Base => vec![span],
            Kind::Delta => Vec::new(),
        };
        if len >= DIRECT_RUN {
            self.flush(kind)?;
            return self.send(Msg::Rows(kind, h.batch.slice(start, len), spans(span)));
        }
        let p = self.pending(kind);
        let b = match p.batches.iter().rposition(|(id, _)| *id == h.id) {
            Some(b) => b,
            None => {
                p.batches.push((h.id, h.batch.clone()));
                p.batches.len() - 1
            }
        };
        match p.runs.last_mut() {
            Some((last, s, n)) if *last == b && *s + *n == start => *n += len,
            _ => p.runs.push((b, start, len)),
        }
        if kind == Kind::Base {
            match p.spans.last_mut() {
                Some(last) if continues(last, &span) => last.len += len,
                _ => p.spans.push(span),
            }
        }
        p.rows += len;
        if p.rows >= BATCH_ROWS {
            self.flush(kind)?;
        }
        Ok(())
    }

    /// Sends the gathered rows of `kind` as one batch.
    fn flush(&mut self, kind: Kind) -> Result<()> {
        let schema = self.schema.clone();
        let p = self.pending(kind);
        if p.runs.is_empty() {
            return Ok(());
        }
        let (batches, runs, spans, rows) = (
            std::mem::take(&mut p.batches),
            std::mem::take(&mut p.runs),
            std::mem::take(&mut p.spans),
            std::mem::take(&mut p.rows),
        );
        let kind = p.kind;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for c in 0..schema.fields().len() {
            let data: Vec<ArrayData> = batches.iter().map(|(_, b)| b.column(c).to_data()).collect();
            let mut out = MutableArrayData::new(data.iter().collect(), false, rows);
            for &(b, start, len) in &runs {
                out.extend(b, start, start + len);
            }
            columns.push(make_array(out.freeze()));
        }
        let batch =
            RecordBatch::try_new(schema, columns).map_err(Error::arrow("gather merged rows"))?;
        self.send(Msg::Rows(kind, batch, spans))
    }

    fn send(&self, msg: Msg) -> Result<()> {
        self.tx
            .send(msg)
            .map_err(|_| Error::Invariant("the compaction writer stopped".into()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::sync_channel;

    #[test]
    fn an_older_generations_doubles_become_whole_numbers_as_the_export_makes_them() {
        use arrow::array::{Float64Array, Int16Array};
        use arrow::datatypes::DataType;
        let doubles: ArrayRef = Arc::new(Float64Array::from(vec![
            Some(1.5),
            Some(2.5),
            Some(-0.5),
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(1e300),
            None,
            Some(70_000.0),
        ]));
        let big = retyped(&doubles, &DataType::Int64).unwrap();
        assert_eq!(
            big.as_primitive::<Int64Type>().iter().collect::<Vec<_>>(),
            [
                Some(2),
                Some(2),
                Some(0),
                None,
                None,
                None,
                None,
                Some(70_000)
            ]
        );
        let small = retyped(&doubles, &DataType::Int16).unwrap();
        let small: Vec<_> = small
            .as_any()
            .downcast_ref::<Int16Array>()
            .unwrap()
            .iter()
            .collect();
        assert_eq!(
            small,
            [Some(2), Some(2), Some(0), None, None, None, None, None]
        );
        // Text that is no number is NULL, not a failed compaction.
        let text: ArrayRef = Arc::new(StringArray::from(vec![Some("12"), Some("x"), None]));
        let n = retyped(&text, &DataType::Int64).unwrap();
        assert_eq!(
            n.as_primitive::<Int64Type>().iter().collect::<Vec<_>>(),
            [Some(12), None, None]
        );
    }

    use arrow::array::{FixedSizeBinaryArray, StringArray};
    use bytes::Bytes;
    use parquet::arrow::ArrowWriter;

    use super::*;
    use crate::compact::output::{Done, Outputs};
    use crate::engine::parallel::{MIN_REPEAT_ROWS, ParallelWriter};
    use crate::lake::manifest::{FileEntry, Manifest, Tier};
    use crate::lake::ranges::key_text;
    use crate::lake::streamed::{self, pump};
    use crate::schema::batch::uuid_field;
    use crate::store::memory::MemoryStore;
    use crate::store::{ObjectStore, PutMode};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::serialized_reader::ReadOptionsBuilder;

    /// A row of a test file: `(row_id, changed_at, deleted_at, name)`.
    type Row<'a> = (u128, i64, i64, &'a str);

    /// A lake-shaped file of rows.
    fn file(rows: &[Row]) -> Bytes {
        let schema = Arc::new(Schema::new(vec![
            uuid_field("row_id", true),
            Field::new("changed_at", arrow::datatypes::DataType::Int64, true),
            Field::new("deleted_at", arrow::datatypes::DataType::Int64, true),
            Field::new("ltbase_created_at", arrow::datatypes::DataType::Int64, true),
            Field::new("name", arrow::datatypes::DataType::Utf8, true),
        ]));
        let ids =
            FixedSizeBinaryArray::try_from_iter(rows.iter().map(|r| r.0.to_be_bytes().to_vec()))
                .unwrap();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(ids),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|_| 1))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.3))),
            ],
        )
        .unwrap();
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        Bytes::from(out)
    }

    fn entry(tier: Tier, path: &str, rows: &[Row], size: usize) -> FileEntry {
        FileEntry {
            tier,
            path: path.into(),
            row_id_min: key_text(rows[0].0),
            row_id_max: key_text(rows[rows.len() - 1].0),
            created_min: 0,
            created_max: 0,
            size_bytes: size as i64,
            row_count: rows.len() as i64,
            checksum: None,
            columns: None,
            extra: Default::default(),
        }
    }

    type Rows = Vec<(u128, i64, String)>;

    /// What the writer received: the base files' rows (a new file at each cut) and the
    /// consolidated delta's.
    #[derive(Debug, Default, PartialEq)]
    struct Out {
        bases: Vec<Rows>,
        delta: Rows,
    }

    /// A merge of `files` (bases first, one stream each, each written by `write`) with
    /// `rewrite` over their ranges, ready to run: its ranges, schema and cursors.
    async fn prepare(
        files: Vec<(Tier, Vec<Row<'_>>)>,
        rewrite: &[bool],
        write: fn(&[Row]) -> Bytes,
    ) -> (Ranges, SchemaRef, Vec<Cursor>, Arc<dyn ObjectStore>) {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let mut entries = Vec::new();
        for (i, (tier, rows)) in files.iter().enumerate() {
            let bytes = write(rows);
            let path = format!("data/1/f{i}.parquet");
            store
                .put_bytes(&path, bytes.clone(), PutMode::Overwrite)
                .await
                .unwrap();
            entries.push(entry(*tier, &path, rows, bytes.len()));
        }
        let m = Manifest {
            files: entries.clone(),
            ..Manifest::empty(1)
        };
        let ranges = Ranges::of(&m);
        let mut sources = Vec::new();
        // Only the rewritten ranges' bases are read, as a pass does.
        let read: Vec<&FileEntry> = entries
            .iter()
            .filter(|e| {
                e.tier == Tier::Delta
                    || ranges
                        .ranges()
                        .iter()
                        .enumerate()
                        .any(|(i, r)| rewrite[i] && r.files.contains(&e.path))
            })
            .collect();
        for e in read {
            let s = streamed::open(store.as_ref(), e).await.unwrap();
            sources.push((s.entry, s.arrow.schema().clone()));
        }
        let schema = merged_schema(&sources).unwrap();
        let mut cursors = Vec::new();
        for (e, _) in sources {
            let (tx, rx) = tokio::sync::mpsc::channel(2);
            cursors.push(Cursor::new(rx, 1));
            tokio::spawn(pump(
                store.clone(),
                vec![streamed::Opening::Later(e)],
                false,
                tx,
            ));
        }
        (ranges, schema, cursors, store)
    }

    /// Merges the files (bases first, one stream each) with `rewrite` over their ranges and
    /// returns what each output received, a `cut` marking a new base file.
    async fn merge(files: Vec<(Tier, Vec<Row<'_>>)>, rewrite: Vec<bool>) -> Out {
        let (ranges, schema, cursors, _store) = prepare(files, &rewrite, file).await;
        let (tx, rx) = sync_channel(16);
        let merged = tokio::task::spawn_blocking(move || {
            Merge::new(&ranges, &rewrite, MIN_REPEAT_ROWS, schema, tx).run(cursors, false)
        });
        let out = tokio::task::spawn_blocking(move || {
            let mut out = Out {
                bases: vec![Vec::new()],
                delta: Vec::new(),
            };
            for msg in rx {
                match msg {
                    Msg::Rows(kind, b, _) => {
                        let (keys, changed, _) = columns_of(&b);
                        let names = b.column_by_name("name").unwrap().as_string::<i32>();
                        let rows = (0..b.num_rows())
                            .map(|i| (keys[i], changed[i], names.value(i).to_string()));
                        match kind {
                            Kind::Base => out.bases.last_mut().unwrap().extend(rows),
                            Kind::Delta => out.delta.extend(rows),
                        }
                    }
                    Msg::Cut => out.bases.push(Vec::new()),
                    Msg::End { .. } => break,
                }
            }
            out
        });
        merged.await.unwrap().unwrap();
        out.await.unwrap()
    }

    fn columns_of(b: &RecordBatch) -> (Vec<Key>, Vec<i64>, Vec<i64>) {
        let ids = b.column_by_name("row_id").unwrap().as_fixed_size_binary();
        let keys = (0..ids.len())
            .map(|i| key(ids.value(i).try_into().unwrap()))
            .collect();
        let int = |n: &str| {
            b.column_by_name(n)
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        };
        (keys, int("changed_at"), int("deleted_at"))
    }

    /// docs/hazards.md L28: a live copy and a tombstone of the same version merge to no row,
    /// whichever file holds which; the newer copy wins whatever its file; tombstones vanish
    /// from a rewritten range.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_newest_copy_wins_and_a_tombstone_wins_a_tie() {
        let out = merge(
            vec![
                (
                    Tier::Base,
                    vec![(10, 5, 0, "a"), (20, 5, 0, "b"), (30, 5, 0, "c")],
                ),
                (Tier::Delta, vec![(10, 7, 0, "a2"), (20, 5, 5, "")]),
                (
                    Tier::Delta,
                    vec![(10, 6, 0, "a1"), (25, 9, 0, "new"), (30, 4, 0, "old")],
                ),
            ],
            vec![true],
        )
        .await;
        let want = Out {
            bases: vec![vec![
                (10, 7, "a2".into()),
                (25, 9, "new".into()),
                (30, 5, "c".into()),
            ]],
            delta: vec![],
        };
        assert_eq!(out, want);
    }

    /// Rows of a kept range go to the consolidated delta with their tombstones; a base file
    /// never spans a kept range.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_of_kept_ranges_keep_their_tombstones_and_bases_are_cut_around_them() {
        let out = merge(
            vec![
                (Tier::Base, vec![(10, 1, 0, "a"), (20, 1, 0, "b")]),
                (Tier::Base, vec![(100, 1, 0, "c"), (120, 1, 0, "d")]),
                (Tier::Base, vec![(200, 1, 0, "e"), (220, 1, 0, "f")]),
                (
                    Tier::Delta,
                    vec![(20, 2, 0, "b2"), (120, 2, 2, ""), (230, 2, 0, "g")],
                ),
            ],
            vec![true, false, true],
        )
        .await;
        let want = Out {
            bases: vec![
                vec![(10, 1, "a".into()), (20, 2, "b2".into())],
                vec![
                    (200, 1, "e".into()),
                    (220, 1, "f".into()),
                    (230, 2, "g".into()),
                ],
            ],
            delta: vec![(120, 2, String::new())],
        };
        assert_eq!(out, want);
    }

    /// A stream opens its files one after the other and lets each go once it was read: memory
    /// holds one footer per stream, not one per source (docs/hazards.md L75).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_holds_one_file_at_a_time() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let mut chain = Vec::new();
        for i in 0..4u128 {
            let rows = [(i * 10 + 1, 1, 0, "a"), (i * 10 + 2, 1, 0, "b")];
            let bytes = file(&rows);
            let path = format!("data/1/b{i}.parquet");
            store
                .put_bytes(&path, bytes.clone(), PutMode::Overwrite)
                .await
                .unwrap();
            chain.push(entry(Tier::Base, &path, &rows, bytes.len()));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let mut cursor = Cursor::new(rx, chain.len());
        let chain = chain.into_iter().map(streamed::Opening::Later).collect();
        tokio::spawn(pump(store.clone(), chain, false, tx));
        let seen = tokio::task::spawn_blocking(move || {
            // (file path, rows, how many earlier files were still held when it was read)
            let mut seen: Vec<(String, usize, usize)> = Vec::new();
            let mut earlier: Vec<std::sync::Weak<Source>> = Vec::new();
            while let Some(Decoded {
                group, batch: b, ..
            }) = cursor.next_batch().unwrap()
            {
                let src = group.source.clone();
                if seen.last().is_none_or(|l| l.0 != src.entry.path) {
                    let held = earlier.iter().filter(|w| w.upgrade().is_some()).count();
                    seen.push((src.entry.path.clone(), 0, held));
                    earlier.push(Arc::downgrade(&src));
                }
                if let Some(l) = seen.last_mut() {
                    l.1 += b.num_rows();
                }
            }
            seen
        })
        .await
        .unwrap();
        let want: Vec<(String, usize, usize)> = (0..4)
            .map(|i| (format!("data/1/b{i}.parquet"), 2, 0))
            .collect();
        assert_eq!(seen, want);
    }

    /// A file whose rows are out of order (or hold a row twice) is refused, not merged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[should_panic(expected = "not sorted by row_id")]
    async fn a_file_out_of_row_id_order_is_refused() {
        merge(
            vec![(
                Tier::Base,
                vec![(10, 1, 0, "a"), (30, 1, 0, "c"), (20, 1, 0, "b")],
            )],
            vec![true],
        )
        .await;
    }

    /// A lake file of rows as compaction and init write them (every column nullable, zstd,
    /// offset indexes, one row group per [`crate::engine::ROW_GROUP_SIZE`] rows).
    fn lake_file(rows: &[Row]) -> Bytes {
        let bytes = file(rows);
        let batch = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .with_batch_size(usize::MAX)
            .build()
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let dir = test_dir();
        let path = dir.join("lake.parquet");
        let mut w = ParallelWriter::create(&path, batch.schema()).unwrap();
        w.write(&batch, &[]).unwrap();
        w.close().unwrap();
        let out = Bytes::from(std::fs::read(&path).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        out
    }

    fn test_dir() -> std::path::PathBuf {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("lakecdc-merge-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// What a rewrite through the real writer produced: per new file its rows and its bytes,
    /// and how many column chunks were copied.
    struct Rewritten {
        files: Vec<(Rows, Bytes)>,
        copied: usize,
    }

    /// Merges `files` into new bases of at most `target` bytes with the real writer (every
    /// range rewritten), lake-shaped sources.
    async fn rewrite_files(files: Vec<(Tier, Vec<Row<'_>>)>, target: u64) -> Rewritten {
        let rewrite = vec![true; files.len()];
        let (ranges, schema, cursors, _store) = prepare(files, &rewrite, lake_file).await;
        let dir = test_dir();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<Done>(1);
        let (ack_tx, ack_rx) = std::sync::mpsc::channel();
        let (msg_tx, msg_rx) = sync_channel(4);
        let outputs = Outputs::new(&dir, schema.clone(), target, done_tx, ack_rx);
        let writer = tokio::task::spawn_blocking(move || outputs.serve(msg_rx));
        let merged = tokio::task::spawn_blocking(move || {
            Merge::new(&ranges, &rewrite, MIN_REPEAT_ROWS, schema, msg_tx).run(cursors, false)
        });
        let mut out = Vec::new();
        let mut streamed = None;
        while let Some(done) = done_rx.recv().await {
            let w = match done {
                Done::Streaming(_, parts) => {
                    streamed = Some(tokio::spawn(crate::store::stream::collect(parts)));
                    continue;
                }
                Done::Finished(w) => w,
            };
            let bytes = match &w.path {
                Some(path) => Bytes::from(std::fs::read(path).unwrap()),
                None => streamed.take().unwrap().await.unwrap().unwrap(),
            };
            let mut rows = Rows::new();
            for b in ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
                .unwrap()
                .build()
                .unwrap()
            {
                let b = b.unwrap();
                let (keys, changed, _) = columns_of(&b);
                let names = b.column_by_name("name").unwrap().as_string::<i32>();
                rows.extend(
                    (0..b.num_rows()).map(|i| (keys[i], changed[i], names.value(i).to_string())),
                );
            }
            // The figures the manifest entry is made of match the file.
            assert_eq!(w.rows, rows.len() as u64, "{:?}", w.path);
            assert_eq!(w.keys, Some((rows[0].0, rows[rows.len() - 1].0)));
            let versions = rows.iter().map(|r| r.1);
            assert_eq!(
                w.changed,
                (versions.clone().min().unwrap(), versions.max().unwrap())
            );
            out.push((rows, bytes));
            let _ = ack_tx.send(());
        }
        merged.await.unwrap().unwrap();
        let totals = writer.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        Rewritten {
            files: out,
            copied: totals.copied_chunks,
        }
    }

    /// The bytes of column `name`'s chunk in row group `rg` of a file.
    fn chunk_bytes(file: &Bytes, rg: usize, name: &str) -> Bytes {
        let reader = SerializedFileReader::new(file.clone()).unwrap();
        let meta = reader.metadata().row_group(rg);
        let c = meta
            .columns()
            .iter()
            .find(|c| c.column_path().parts()[0] == name)
            .unwrap();
        let (start, len) = c.byte_range();
        file.slice(start as usize..(start + len) as usize)
    }

    const N: usize = 40_000;

    fn names() -> Vec<String> {
        (0..N).map(|i| format!("name-{i}")).collect()
    }

    /// A base of N rows (ids 2, 4, …), version 1.
    fn base_rows(names: &[String]) -> Vec<Row<'_>> {
        (0..N)
            .map(|i| (2 * i as u128 + 2, 1, 0, names[i].as_str()))
            .collect()
    }

    /// docs/design.md §9: a base row group that a delta changes a few rows of comes out row
    /// for row as it went in; its unchanged columns are copied as they are (the same bytes),
    /// the changed ones encoded again, and the rows read back are the merge's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_base_row_group_a_delta_changes_a_few_rows_of_keeps_its_unchanged_chunks() {
        let names = names();
        let base = base_rows(&names);
        // Two rows changed in version only, one in its name too.
        let delta = vec![
            (2 * 100 + 2, 5, 0, "name-100"),
            (2 * 7000 + 2, 5, 0, "renamed"),
            (2 * (N as u128 - 1) + 2, 5, 0, names[N - 1].as_str()),
        ];
        let out = rewrite_files(
            vec![(Tier::Base, base.clone()), (Tier::Delta, delta)],
            1 << 30,
        )
        .await;
        assert_eq!(out.files.len(), 1);
        let (rows, bytes) = &out.files[0];
        let want: Rows = base
            .iter()
            .map(|&(id, v, _, name)| match id {
                202 | 14_002 => (
                    id,
                    5,
                    if id == 14_002 {
                        "renamed".into()
                    } else {
                        name.into()
                    },
                ),
                id if id == 2 * (N as u128 - 1) + 2 => (id, 5, name.into()),
                _ => (id, v, name.into()),
            })
            .collect();
        assert_eq!(rows, &want);
        // row_id, deleted_at and ltbase_created_at are copied; changed_at and name are not.
        assert_eq!(out.copied, 3);
        let source = lake_file(&base);
        for column in ["row_id", "deleted_at", "ltbase_created_at"] {
            assert_eq!(
                chunk_bytes(bytes, 0, column),
                chunk_bytes(&source, 0, column),
                "{column}"
            );
        }
        // DuckDB reads the copied chunks as they read in the source.
        let dir = test_dir();
        let path = dir.join("out.parquet");
        std::fs::write(&path, bytes).unwrap();
        let conn = duckdb::Connection::open_in_memory().unwrap();
        let (rows, renamed, newest, first): (i64, i64, i64, String) = conn
            .query_row(
                &format!(
                    "SELECT count(*), count(*) FILTER (name = 'renamed'), \
                     count(*) FILTER (changed_at = 5), min(name) FROM '{}'",
                    path.display()
                ),
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((rows, renamed, newest), (N as i64, 1, 3));
        assert_eq!(first, "name-0");
        for column in ["changed_at", "name"] {
            assert_ne!(
                chunk_bytes(bytes, 0, column),
                chunk_bytes(&source, 0, column),
                "{column}"
            );
        }
    }

    /// A row group that does not come out row for row (a row deleted, a row inserted) is
    /// encoded whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_base_row_group_that_loses_or_gains_a_row_is_encoded_whole() {
        let names = names();
        let base = base_rows(&names);
        for (delta, want_rows) in [
            (vec![(2 * 500 + 2, 5, 5, "")], N - 1),
            (vec![(2 * 500 + 3, 5, 0, "new")], N + 1),
        ] {
            let out = rewrite_files(
                vec![(Tier::Base, base.clone()), (Tier::Delta, delta.clone())],
                1 << 30,
            )
            .await;
            assert_eq!(out.copied, 0, "{delta:?}");
            let (rows, _) = &out.files[0];
            assert_eq!(rows.len(), want_rows, "{delta:?}");
            assert!(rows.windows(2).all(|w| w[0].0 < w[1].0));
            assert_eq!(rows.iter().any(|r| r.0 == 1002), want_rows > N, "{delta:?}");
            assert_eq!(rows.iter().any(|r| r.0 == 1003), want_rows > N, "{delta:?}");
        }
    }

    /// Rows ahead of a base row group the file would repeat do not share a row group with it,
    /// and a file too full for a whole row group is cut before it: both row groups of two
    /// bases are copied into files of their own, the new row between them in the first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn row_groups_line_up_with_the_bases_they_repeat() {
        let names = names();
        let first = base_rows(&names);
        let second: Vec<Row> = (0..N)
            .map(|i| (2 * (N + i) as u128 + 2, 1, 0, names[i].as_str()))
            .collect();
        let gap = 2 * N as u128 + 1;
        let delta = vec![(4, 3, 0, "name-1"), (gap, 3, 0, "between")];
        let one = lake_file(&first).len() as u64;
        // Room for one base's row group and a little more, not for two.
        let out = rewrite_files(
            vec![
                (Tier::Base, first.clone()),
                (Tier::Base, second),
                (Tier::Delta, delta),
            ],
            one * 3 / 2,
        )
        .await;
        assert_eq!(out.files.len(), 2, "one file per base");
        let groups = |b: &Bytes| {
            let r = SerializedFileReader::new(b.clone()).unwrap();
            r.metadata()
                .row_groups()
                .iter()
                .map(|g| g.num_rows())
                .collect::<Vec<_>>()
        };
        assert_eq!(groups(&out.files[0].1), vec![N as i64, 1]);
        assert_eq!(groups(&out.files[1].1), vec![N as i64]);
        assert_eq!(
            out.files[0].0.last().unwrap(),
            &(gap, 3, "between".to_string())
        );
        // The first base: all but changed_at copied (row 1's name is unchanged); the second:
        // every column.
        assert_eq!(out.copied, 4 + 5);
    }

    /// A repeated row group whose changed columns grew past what the file had left is not
    /// written there: it starts the next file, and each file's figures (rows, row ids,
    /// versions) are those of the rows it holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeated_row_group_that_grew_past_the_file_starts_the_next() {
        let names = names();
        let first = base_rows(&names);
        let second: Vec<Row> = (0..N)
            .map(|i| (2 * (N + i) as u128 + 2, 1, 0, names[i].as_str()))
            .collect();
        // 2,000 rows of the second base get long names that compress poorly.
        let long: Vec<String> = (0..2000)
            .map(|i| {
                (0..6)
                    .map(|k| {
                        format!(
                            "{:016x}",
                            (i as u64 + 1)
                                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                                .rotate_left(k * 7)
                        )
                    })
                    .collect()
            })
            .collect();
        let delta: Vec<Row> = (0..2000)
            .map(|i| (second[i * 20].0, 3, 0, long[i].as_str()))
            .collect();
        let third: Vec<Row> = (0..N)
            .map(|i| (2 * (2 * N + i) as u128 + 2, 1, 0, names[i].as_str()))
            .collect();
        let one = lake_file(&first).len() as u64;
        // Room for the second base's row group as it was, not as it becomes. It is the last
        // row group of the pass (left over when the file closes), or a third base follows it
        // (left over when the next row group starts).
        let target = one * 5 / 2;
        for bases in [2, 3] {
            let mut files = vec![(Tier::Base, first.clone()), (Tier::Base, second.clone())];
            if bases == 3 {
                files.push((Tier::Base, third.clone()));
            }
            files.push((Tier::Delta, delta.clone()));
            let out = rewrite_files(files, target).await;
            assert_eq!(out.files.len(), bases, "{bases} bases");
            for (i, (rows, bytes)) in out.files.iter().enumerate() {
                assert_eq!(rows.len(), N, "{bases} bases, file {i}");
                assert!(bytes.len() as u64 <= target, "{} > {target}", bytes.len());
            }
            assert_eq!(out.files[0].0[N - 1].0, first[N - 1].0);
            assert_eq!(out.files[1].0[20], (second[20].0, 3, long[1].clone()));
            // The first and third bases whole, the second but its names and versions.
            assert_eq!(out.copied, 5 + 3 + 5 * (bases - 2), "{bases} bases");
        }
    }

    /// Rows a rewrite wrote, encoded afresh as one lake file.
    fn encoded_again(rows: &Rows) -> Bytes {
        lake_file(
            &rows
                .iter()
                .map(|(id, v, name)| (*id, *v, 0, name.as_str()))
                .collect::<Vec<_>>(),
        )
    }

    /// `base` (one base file) and a delta of every 100th row in a new version (its name
    /// unchanged), rewritten into bases of a target 1% above the base's size; the rows are
    /// checked to be the merge's. Returns the rewrite and the target.
    async fn every_hundredth_rewritten_at_the_target(base: &[Row<'_>]) -> (Rewritten, u64) {
        let delta: Vec<Row> = base.iter().step_by(100).map(|r| (r.0, 3, 0, r.3)).collect();
        let target = lake_file(base).len() as u64 * 101 / 100;
        let out = rewrite_files(
            vec![(Tier::Base, base.to_vec()), (Tier::Delta, delta)],
            target,
        )
        .await;
        let want: Rows = base
            .iter()
            .enumerate()
            .map(|(i, &(id, v, _, name))| (id, if i % 100 == 0 { 3 } else { v }, name.into()))
            .collect();
        let rows: Rows = out
            .files
            .iter()
            .flat_map(|(r, _)| r.iter().cloned())
            .collect();
        assert_eq!(rows, want);
        (out, target)
    }

    /// docs/design.md §9: a base row group as large as the target, which its changed columns
    /// would grow past it, is cut at its `row_id` page starts into runs, each a row group of
    /// its own with its unchanged columns copied page by page. No file passes the target, the
    /// rows are the merge's, each copied chunk is what encoding its rows makes (bytes, sizes,
    /// values, statistics), and DuckDB reads the files as the rows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_base_row_group_too_large_to_repeat_whole_is_repeated_run_by_run() {
        let names = names();
        let base = base_rows(&names);
        let (out, target) = every_hundredth_rewritten_at_the_target(&base).await;
        // Two runs (the row_id column's pages hold 20,480 rows), a file each.
        let groups: Vec<Vec<i64>> = out
            .files
            .iter()
            .map(|(_, b)| {
                let r = SerializedFileReader::new(b.clone()).unwrap();
                r.metadata()
                    .row_groups()
                    .iter()
                    .map(|g| g.num_rows())
                    .collect()
            })
            .collect();
        assert_eq!(groups, vec![vec![20_480], vec![N as i64 - 20_480]]);
        // All but changed_at copied in both runs.
        assert_eq!(out.copied, 8);
        let dir = test_dir();
        let conn = duckdb::Connection::open_in_memory().unwrap();
        for (i, (rows, bytes)) in out.files.iter().enumerate() {
            assert!(bytes.len() as u64 <= target, "{} > {target}", bytes.len());
            // The same rows encoded: the copied chunks are what encoding makes.
            let fresh = encoded_again(rows);
            let meta = |b: &Bytes| {
                SerializedFileReader::new(b.clone())
                    .unwrap()
                    .metadata()
                    .clone()
            };
            let (copied, encoded) = (meta(bytes), meta(&fresh));
            for column in ["row_id", "deleted_at", "ltbase_created_at", "name"] {
                let find = |m: &parquet::file::metadata::ParquetMetaData| {
                    m.row_group(0)
                        .columns()
                        .iter()
                        .find(|c| c.column_path().parts()[0] == column)
                        .unwrap()
                        .clone()
                };
                let (a, b) = (find(&copied), find(&encoded));
                assert_eq!(a.num_values(), b.num_values(), "file {i}, {column}");
                // A copied run keeps the whole row group's dictionary: the names' bytes differ
                // from a run encoded alone; the plain columns' do not.
                if column == "name" {
                    assert!(a.dictionary_page_offset().is_some());
                } else {
                    assert_eq!(
                        chunk_bytes(bytes, 0, column),
                        chunk_bytes(&fresh, 0, column)
                    );
                    assert_eq!(
                        (a.compressed_size(), a.uncompressed_size()),
                        (b.compressed_size(), b.uncompressed_size()),
                        "file {i}, {column}"
                    );
                }
                assert_eq!(a.statistics(), b.statistics(), "file {i}, {column}");
                assert_eq!(
                    (
                        a.unencoded_byte_array_data_bytes(),
                        a.definition_level_histogram()
                    ),
                    (
                        b.unencoded_byte_array_data_bytes(),
                        b.definition_level_histogram()
                    ),
                    "file {i}, {column}"
                );
            }
            let path = dir.join(format!("out-{i}.parquet"));
            std::fs::write(&path, bytes).unwrap();
        }
        let (count, newest, ids, first): (i64, i64, i64, String) = conn
            .query_row(
                &format!(
                    "SELECT count(*), count(*) FILTER (changed_at = 3), count(DISTINCT row_id), \
                     min(name) FROM '{}/out-*.parquet' WHERE deleted_at = 0",
                    dir.display()
                ),
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((count, newest, ids), (N as i64, N as i64 / 100, N as i64));
        assert_eq!(first, "name-0");
    }

    /// docs/design.md §9: a run whose text column fell back from its dictionary to plain pages
    /// that start elsewhere than the run copies those plain pages and encodes only the rows
    /// before and after them, without a dictionary. The chunk holds the source's pages byte
    /// for byte; its statistics (bounds past the truncation length, cut as the writer cuts
    /// them), values and sizes are those of encoding the same rows; its offset index lets a
    /// reader skip to any row; DuckDB and the parquet reader read the rows back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_copies_the_plain_pages_of_a_text_column_whose_pages_start_elsewhere() {
        // Unique names past 64 bytes, a character of two bytes across the cut: the dictionary
        // falls back after a few thousand rows and the pages are cut by size.
        let names: Vec<String> = (0..N)
            .map(|i| {
                format!(
                    "{}é{:016x}{:016x}",
                    "n".repeat(60 + i % 5),
                    (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    i
                )
            })
            .collect();
        let base = base_rows(&names);
        let source = lake_file(&base);
        let (out, target) = every_hundredth_rewritten_at_the_target(&base).await;
        assert_eq!(out.files.len(), 2);
        // Every column but changed_at copied in both runs, the names included.
        assert_eq!(out.copied, 8);
        // The source's name pages, by their bytes.
        let pages_of = |file: &Bytes| -> Vec<Bytes> {
            let options = ReadOptionsBuilder::new().with_page_index().build();
            let reader = SerializedFileReader::new_with_options(file.clone(), options).unwrap();
            let meta = reader.metadata();
            let c = meta
                .row_group(0)
                .columns()
                .iter()
                .position(|c| c.column_path().parts()[0] == "name")
                .unwrap();
            meta.offset_index().unwrap()[0][c]
                .page_locations
                .iter()
                .map(|p| {
                    file.slice(
                        p.offset as usize..(p.offset as usize + p.compressed_page_size as usize),
                    )
                })
                .collect()
        };
        let source_pages = pages_of(&source);
        let dir = test_dir();
        let mut at = 0;
        for (i, (rows, bytes)) in out.files.iter().enumerate() {
            assert!(bytes.len() as u64 <= target, "{} > {target}", bytes.len());
            let fresh = encoded_again(rows);
            let name = |b: &Bytes| {
                let r = SerializedFileReader::new(b.clone()).unwrap();
                r.metadata()
                    .row_group(0)
                    .columns()
                    .iter()
                    .find(|c| c.column_path().parts()[0] == "name")
                    .unwrap()
                    .clone()
            };
            let (a, b) = (name(bytes), name(&fresh));
            assert_eq!(a.dictionary_page_offset(), None, "file {i}");
            assert_eq!(a.num_values(), b.num_values(), "file {i}");
            assert_eq!(a.statistics(), b.statistics(), "file {i}");
            assert!(!a.statistics().unwrap().max_is_exact(), "file {i}");
            assert_eq!(
                (
                    a.unencoded_byte_array_data_bytes(),
                    a.definition_level_histogram()
                ),
                (
                    b.unencoded_byte_array_data_bytes(),
                    b.definition_level_histogram()
                ),
                "file {i}"
            );
            // Pages of the source, as they were, between pages encoded here.
            let pages = pages_of(bytes);
            let copied = pages.iter().filter(|p| source_pages.contains(p)).count();
            assert!(
                copied >= 1 && copied < pages.len(),
                "file {i}: {copied} of {}",
                pages.len()
            );
            // Skipping by the offset index: rows from the middle of the file.
            let (from, len) = (rows.len() / 2 - 3, 7);
            let selection = parquet::arrow::arrow_reader::RowSelection::from(vec![
                parquet::arrow::arrow_reader::RowSelector::skip(from),
                parquet::arrow::arrow_reader::RowSelector::select(len),
            ]);
            let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
                .with_offset_index_policy(parquet::file::metadata::PageIndexPolicy::Required);
            let picked: Vec<String> =
                ParquetRecordBatchReaderBuilder::try_new_with_options(bytes.clone(), options)
                    .unwrap()
                    .with_row_selection(selection)
                    .build()
                    .unwrap()
                    .flat_map(|b| {
                        let b = b.unwrap();
                        let n = b.column_by_name("name").unwrap().as_string::<i32>().clone();
                        (0..n.len()).map(move |k| n.value(k).to_string())
                    })
                    .collect();
            assert_eq!(picked, names[at + from..at + from + len], "file {i}");
            at += rows.len();
            std::fs::write(dir.join(format!("out-{i}.parquet")), bytes).unwrap();
        }
        let conn = duckdb::Connection::open_in_memory().unwrap();
        let (count, distinct, length, lo, hi): (i64, i64, i64, String, String) = conn
            .query_row(
                &format!(
                    "SELECT count(*), count(DISTINCT name), sum(length(name))::BIGINT, min(name), \
                     max(name) FROM '{}/out-*.parquet'",
                    dir.display()
                ),
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let chars: usize = names.iter().map(|n| n.chars().count()).sum();
        assert_eq!(
            (count, distinct, length as usize),
            (N as i64, N as i64, chars)
        );
        assert_eq!(
            (&lo, &hi),
            (names.iter().min().unwrap(), names.iter().max().unwrap())
        );
    }

    /// A repeated row group that grew past the target even alone is written again as rows the
    /// writer cuts by size: no file passes the target, and every row is there once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeated_row_group_that_grew_past_the_target_alone_is_cut_by_size() {
        let names = names();
        let base = base_rows(&names);
        let long: Vec<String> = (0..2000)
            .map(|i| {
                format!(
                    "{:064x}",
                    (i as u128 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
                )
            })
            .collect();
        let delta: Vec<Row> = (0..2000)
            .map(|i| (base[i * 20].0, 3, 0, long[i].as_str()))
            .collect();
        let second: Vec<Row> = (0..N)
            .map(|i| (2 * (N + i) as u128 + 2, 1, 0, names[i].as_str()))
            .collect();
        // A tenth more than the larger base takes.
        let target = lake_file(&base).len().max(lake_file(&second).len()) as u64 * 11 / 10;
        // Left over when the file closes, or when a second base's row group starts (which
        // is then copied whole into a file of its own).
        for bases in [1, 2] {
            let mut files = vec![(Tier::Base, base.clone())];
            if bases == 2 {
                files.push((Tier::Base, second.clone()));
            }
            files.push((Tier::Delta, delta.clone()));
            let out = rewrite_files(files, target).await;
            assert!(
                out.files.len() > bases,
                "{bases}: {} files",
                out.files.len()
            );
            assert_eq!(out.copied, 5 * (bases - 1), "{bases}");
            let rows: Rows = out
                .files
                .iter()
                .flat_map(|(r, _)| r.iter().cloned())
                .collect();
            assert_eq!(rows.len(), N * bases);
            assert_eq!(rows[40], (base[40].0, 3, long[2].clone()));
            assert_eq!(rows[41], (base[41].0, 1, names[41].clone()));
            for (_, bytes) in &out.files {
                assert!(bytes.len() as u64 <= target, "{} > {target}", bytes.len());
            }
        }
    }
}
