//! The files a compaction writes (docs/design.md §9): new bases, each cut before it would pass
//! `--target-base-size` and wherever the merge leaves a kept range between two rewritten
//! ones, and at most one consolidated delta. Runs on its own thread, fed by the merge; each
//! finished base goes to the uploader at once, and a new base is only started once at most
//! one finished base is still waiting for its upload, so local disk holds at most the base
//! being written and one being uploaded, whatever the schema's size. The consolidated delta,
//! which has no size limit (it holds what the deltas hold), is never on local disk: its bytes
//! go to a streamed upload as it is written.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, SchemaRef};
use tokio::sync::mpsc;

use parquet::file::reader::ChunkReader;

use crate::engine::parallel::{
    Closed, Earlier, Finished, ParallelWriter, Span, Spill, Stream, footer_margin,
};
use crate::error::{Error, Result};
use crate::lake::footer;
use crate::lake::manifest::Tier;
use crate::lake::ranges::{Key, key};
use crate::lake::streamed::Group;
use crate::store::stream::{self, PartWriter, Parts};

use super::pages;

/// Which output a batch goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A new base file.
    Base,
    /// The consolidated delta.
    Delta,
}

/// What the writer hands the uploader.
#[derive(Debug)]
pub(crate) enum Done {
    /// An output of `kind` is being written to a streamed upload: store what `parts` yields
    /// under a new key. Its [`Written`] follows once its object is complete.
    Streaming(Kind, Parts),
    /// A finished output.
    Finished(Written),
}

/// The consolidated delta's bytes go to its streamed upload.
impl Stream for PartWriter {
    fn end(&mut self) -> std::io::Result<()> {
        PartWriter::end(self)
    }
}

/// What the merge sends the writer.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Rows for an output, sorted by `row_id`, after every row sent before, and where they
    /// come from (for a new base; empty otherwise).
    Rows(Kind, RecordBatch, Vec<Span>),
    /// The next base rows belong to a range that is not adjacent to the last one: start a new
    /// base file.
    Cut,
    /// The merge is complete. With `zero_row_base`, a pass that wrote no file at all writes a
    /// zero-row base (docs/hazards.md #519).
    End {
        /// Write a zero-row base when nothing else was written.
        zero_row_base: bool,
    },
}

/// A finished output file, waiting for its upload.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    /// Base or consolidated delta.
    pub kind: Kind,
    /// The local file; none for a streamed output (its upload is under way).
    pub path: Option<PathBuf>,
    /// Rows in it.
    pub rows: u64,
    /// Its smallest and largest `row_id` (none for a zero-row file).
    pub keys: Option<(Key, Key)>,
    /// Smallest and largest `changed_at` (0 for a zero-row file).
    pub changed: (i64, i64),
    /// Its columns and their DuckDB types, in file order.
    pub columns: Vec<(String, String)>,
}

/// What the writer did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Totals {
    /// Files finished.
    pub files: usize,
    /// The most bytes the output files held on local disk at once.
    pub scratch_peak: u64,
    /// Column chunks copied from the sources as they are.
    pub copied_chunks: usize,
}

/// An output file being written.
struct Open {
    /// The local file; none for a streamed output.
    path: Option<PathBuf>,
    /// Encoded bytes per Arrow byte before anything is appended: the last file's.
    first_ratio: f64,
    writer: ParallelWriter,
    stats: Stats,
    /// The figures as they were before each of the last row groups that repeat a base's
    /// started: a row group the writer leaves for the next file is taken back to its mark.
    marks: Vec<Stats>,
}

/// `stats` before a row group of `rows` rows, the last counted but for `after` rows: the mark
/// taken where it started.
fn taken_back(stats: &Stats, marks: &[Stats], rows: usize, after: usize) -> Result<Stats> {
    let start = stats.rows.saturating_sub((rows + after) as u64);
    marks
        .iter()
        .rfind(|m| m.rows == start)
        .cloned()
        .ok_or_else(|| Error::Invariant("a row group left for the next file has no mark".into()))
}

/// What a file holds, counted as rows are appended.
#[derive(Debug, Clone, Default)]
struct Stats {
    rows: u64,
    /// Arrow bytes appended (what [`Open::ratio`] compares the encoded bytes with).
    arrow_bytes: u64,
    keys: Option<(Key, Key)>,
    changed: Option<(i64, i64)>,
}

impl Stats {
    /// Counts `batch`, whose rows follow every row counted.
    fn count(&mut self, batch: &RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let row_ids = batch
            .column_by_name("row_id")
            .and_then(|c| c.as_fixed_size_binary_opt())
            .ok_or_else(|| Error::Invariant("an output batch without row_id".into()))?;
        let at = |i: usize| -> Result<Key> {
            let bytes: &[u8; 16] = row_ids
                .value(i)
                .try_into()
                .map_err(|_| Error::Invariant("a row_id of other than 16 bytes".into()))?;
            Ok(key(bytes))
        };
        let (first, last) = (at(0)?, at(n - 1)?);
        self.keys = Some(match self.keys {
            None => (first, last),
            Some((min, _)) => (min, last),
        });
        let changed = batch
            .column_by_name("changed_at")
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| Error::Invariant("an output batch without changed_at".into()))?;
        if let (Some(lo), Some(hi)) = (arrow::compute::min(changed), arrow::compute::max(changed)) {
            self.changed = Some(match self.changed {
                None => (lo, hi),
                Some((a, b)) => (a.min(lo), b.max(hi)),
            });
        }
        self.rows += n as u64;
        self.arrow_bytes += batch_bytes(batch);
        Ok(())
    }
}

impl Open {
    /// The bytes the file holds or will hold for what was appended so far: the flushed row
    /// groups and the writer's estimate of the buffered one.
    fn encoded(&self) -> u64 {
        self.writer.bytes_written() + self.writer.in_progress_size()
    }

    /// Encoded bytes per Arrow byte so far (1 before anything was appended): what a batch
    /// will add to the file, estimated from its Arrow size.
    fn ratio(&self) -> f64 {
        if self.stats.arrow_bytes == 0 {
            return self.first_ratio;
        }
        (self.encoded() as f64 / self.stats.arrow_bytes as f64).clamp(0.01, 1.5)
    }

    /// Takes the counted figures back to before the row group `group` (its `rows` rows, the
    /// last rows of the file but for `after` rows counted after it).
    fn take_back(&mut self, rows: usize, after: usize) -> Result<()> {
        let start = self.stats.rows - (rows + after) as u64;
        let mark = self
            .marks
            .iter()
            .rfind(|m| m.rows == start)
            .ok_or_else(|| {
                Error::Invariant("a row group left for the next file has no mark".into())
            })?;
        self.stats = mark.clone();
        Ok(())
    }

    /// Appends a row group the file before could not take.
    fn take_over(&mut self, group: Finished) -> Result<()> {
        for b in &group.held {
            self.stats.count(b)?;
        }
        self.writer.append(group)
    }
}

/// A base row group too large to repeat whole, and the runs it was cut into.
type Declined = (Arc<dyn Earlier>, Vec<Arc<dyn Earlier>>);

/// The writer thread's state.
pub(crate) struct Outputs {
    dir: PathBuf,
    schema: SchemaRef,
    target: u64,
    base: Option<Open>,
    delta: Option<Open>,
    next: usize,
    done: mpsc::Sender<Done>,
    /// One message per local file's upload finished, in the order the files were handed over.
    acks: Receiver<()>,
    /// Sizes of finished files not yet uploaded (their local copies still exist), oldest first.
    waiting: VecDeque<u64>,
    totals: Totals,
    /// Encoded bytes per Arrow byte of the last file finished (1 before the first): what a
    /// new file's first rows are estimated by.
    ratio: f64,
    /// The last base row group too large to repeat whole, and the runs it was cut into
    /// (none when it could not be cut).
    declined: Option<Declined>,
}

/// The bytes `batch` takes in memory (its slice only).
fn batch_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0) as u64)
        .sum()
}

impl Outputs {
    /// Writes into `dir`; finished files go to `done`, and `acks` tells when the oldest
    /// upload finished.
    pub(crate) fn new(
        dir: &Path,
        schema: SchemaRef,
        target: u64,
        done: mpsc::Sender<Done>,
        acks: Receiver<()>,
    ) -> Self {
        Self {
            dir: dir.to_path_buf(),
            schema,
            target,
            base: None,
            delta: None,
            next: 0,
            done,
            acks,
            waiting: VecDeque::new(),
            totals: Totals::default(),
            ratio: 1.0,
            declined: None,
        }
    }

    /// Serves the merge's messages until [`Msg::End`]; a merge that hangs up without it
    /// failed, and nothing more is finished.
    pub(crate) fn serve(mut self, rx: Receiver<Msg>) -> Result<Totals> {
        loop {
            let msg = rx.recv().map_err(|_| {
                Error::Invariant("the merge ended without finishing its outputs".into())
            })?;
            // An upload failed and the uploader stopped: nothing more is worth writing.
            if self.done.is_closed() {
                return Err(Error::Invariant("the uploader stopped".into()));
            }
            match msg {
                Msg::Rows(kind, batch, spans) => self.write(kind, batch, spans)?,
                Msg::Cut => self.finish_all(Kind::Base)?,
                Msg::End { zero_row_base } => {
                    self.finish_all(Kind::Base)?;
                    self.finish_all(Kind::Delta)?;
                    if zero_row_base && self.totals.files == 0 {
                        self.start(Kind::Base)?;
                        self.finish(Kind::Base)?;
                    }
                    return Ok(self.totals);
                }
            }
        }
    }

    fn slot(&mut self, kind: Kind) -> &mut Option<Open> {
        match kind {
            Kind::Base => &mut self.base,
            Kind::Delta => &mut self.delta,
        }
    }

    /// Local bytes now: the finished files waiting for upload and the open local ones.
    fn note_scratch(&mut self) {
        let open: u64 = [&self.base, &self.delta]
            .iter()
            .filter_map(|o| o.as_ref())
            .filter(|o| o.path.is_some())
            .map(|o| o.writer.bytes_written())
            .sum();
        let now = open + self.waiting.iter().sum::<u64>();
        self.totals.scratch_peak = self.totals.scratch_peak.max(now);
    }

    /// Opens a new file of `kind`: a base on local disk, first waiting until at most one
    /// finished base is still being uploaded; the consolidated delta as a streamed upload.
    fn start(&mut self, kind: Kind) -> Result<()> {
        let (path, writer) = match kind {
            Kind::Base => {
                while self.waiting.len() > 1 {
                    self.wait_for_upload()?;
                }
                let path = self.dir.join(format!("out-{}.parquet", self.next));
                self.next += 1;
                let mut writer = ParallelWriter::create(&path, self.schema.clone())?;
                writer.set_limit(self.target);
                (Some(path), writer)
            }
            Kind::Delta => {
                let (upload, parts) = stream::channel();
                self.done
                    .blocking_send(Done::Streaming(kind, parts))
                    .map_err(|_| Error::Invariant("the uploader stopped".into()))?;
                let name = Path::new("the consolidated delta (streamed)");
                (
                    None,
                    ParallelWriter::streamed(name, Box::new(upload), self.schema.clone())?,
                )
            }
        };
        let first_ratio = self.ratio;
        *self.slot(kind) = Some(Open {
            path,
            first_ratio,
            writer,
            stats: Stats::default(),
            marks: Vec::new(),
        });
        Ok(())
    }

    fn wait_for_upload(&mut self) -> Result<()> {
        loop {
            match self.acks.recv_timeout(Duration::from_millis(200)) {
                Ok(()) => {
                    self.waiting.pop_front();
                    return Ok(());
                }
                Err(RecvTimeoutError::Timeout) if !self.done.is_closed() => {}
                Err(_) => {
                    return Err(Error::Invariant(
                        "the uploader stopped before the outputs were written".into(),
                    ));
                }
            }
        }
    }

    /// Writes `batch` to `kind`'s file; a base file about to pass the target is finished
    /// first (at a row boundary) and the rest goes to a new one.
    fn write(&mut self, kind: Kind, batch: RecordBatch, spans: Vec<Span>) -> Result<()> {
        let mut rest = batch;
        // A base row group too large to repeat with room to spare, even alone in a file
        // (its changed columns may grow it past the target), is cut at page starts into runs
        // that fit, each repeated as a row group of its own (docs/design.md §9); one that
        // cannot be cut is written as rows of no earlier row group, cut by size.
        let fits = (self.target - self.target / 20)
            .saturating_sub(footer_margin(self.schema.fields().len(), 1));
        let mut spans_in = Vec::with_capacity(spans.len());
        for s in spans {
            if let Some((e, 0)) = &s.from
                && e.compressed_bytes() > fits
            {
                let room = self.room(kind).unwrap_or(fits);
                self.declined = Some((e.clone(), e.clone().cut(room, fits)));
            }
            match (&self.declined, &s.from) {
                (Some((whole, runs)), Some((e, pos))) if Arc::ptr_eq(whole, e) => {
                    into_runs(runs, *pos, s, &mut spans_in);
                }
                _ => spans_in.push(s),
            }
        }
        let mut spans = spans_in;
        while rest.num_rows() > 0 {
            if self.slot(kind).is_none() {
                self.start(kind)?;
            }
            let target = self.target;
            let open = self
                .slot(kind)
                .as_mut()
                .ok_or_else(|| Error::Invariant("no open output".into()))?;
            let rows = rest.num_rows();
            let (take, full) = if kind == Kind::Base {
                let used =
                    open.encoded() + footer_margin(rest.num_columns(), open.writer.row_groups());
                // 5% is kept for estimates that fall short, and a row group that repeats a base
                // one starts in a file only with that much room left for it; its rows are then
                // counted by its compressed bytes, which are known, and if its changed columns
                // grew it past the target after all it is left for the next file (a spill).
                let hard = target.saturating_sub(used);
                let room = (target - target / 20).saturating_sub(used);
                let repeat = spans.first().and_then(starts_repeat);
                if open.stats.rows > 0 && repeat.is_some_and(|bytes| bytes > room) {
                    (0, true)
                } else {
                    // Up to the next such row group, where this is asked again.
                    let upto = next_repeat(&spans).min(rows);
                    let need = estimate(&rest.slice(0, upto), &spans, open.ratio());
                    let limit = if repeats_only(&spans, upto) {
                        hard
                    } else {
                        room
                    };
                    if need <= limit {
                        (upto, false)
                    } else {
                        let fit =
                            usize::try_from(u128::from(limit) * upto as u128 / u128::from(need))
                                .unwrap_or(upto);
                        // A file holds at least one row, however small the target.
                        (
                            if fit == 0 && open.stats.rows == 0 {
                                1
                            } else {
                                fit
                            },
                            true,
                        )
                    }
                }
            } else {
                (rows, false)
            };
            if take > 0 {
                let part = rest.slice(0, take);
                let after = split_spans(&mut spans, take);
                if let Some(spill) = open.append(&part, &spans)? {
                    // The file could not take a whole repeated row group: it goes first into
                    // the next file (or is written again, cut by size, when it was alone),
                    // and the rows after it follow it.
                    let taken = split_spans(&mut spans, spill.taken);
                    let alone = open.writer.row_groups() == 0;
                    if alone {
                        self.rewrite_fresh(kind, spill.group)?;
                    } else {
                        self.finish(kind)?;
                        self.start(kind)?;
                        self.slot(kind)
                            .as_mut()
                            .ok_or_else(|| Error::Invariant("no open output".into()))?
                            .take_over(spill.group)?;
                    }
                    let mut back = taken;
                    back.extend(after);
                    spans = back;
                    rest = rest.slice(spill.taken, rows - spill.taken);
                    self.note_scratch();
                    continue;
                }
                spans = after;
                rest = rest.slice(take, rows - take);
            }
            if full && rest.num_rows() > 0 {
                self.finish(kind)?;
            }
            self.note_scratch();
        }
        Ok(())
    }

    /// What `kind`'s open file has left for rows repeating an earlier row group (5% kept
    /// for estimates that fall short); none when no file is open or it holds no row yet.
    fn room(&mut self, kind: Kind) -> Option<u64> {
        let (target, columns) = (self.target, self.schema.fields().len());
        let open = self.slot(kind).as_ref().filter(|o| o.stats.rows > 0)?;
        let used = open.encoded() + footer_margin(columns, open.writer.row_groups());
        Some((target - target / 20).saturating_sub(used))
    }

    /// Closes `kind`'s open file, if any, and hands it to the uploader. A last row group the
    /// file could not take starts the next file, which is left open; [`Outputs::finish_all`]
    /// closes that one too.
    fn finish(&mut self, kind: Kind) -> Result<()> {
        let Some(Open {
            path,
            first_ratio: _,
            writer,
            mut stats,
            marks,
        }) = self.slot(kind).take()
        else {
            return Ok(());
        };
        let Closed {
            copied,
            spilled,
            metadata,
            size,
        } = writer.close()?;
        self.totals.copied_chunks += copied;
        if let Some(group) = &spilled {
            stats = taken_back(&stats, &marks, group.rows, 0)?;
        }
        let spilled = match spilled {
            Some(group) if stats.rows == 0 => {
                // The row group was alone: the file holds nothing, and the rows are written
                // again, cut by size. (Only a base has a size limit, and a base is local.)
                if let Some(path) = &path {
                    std::fs::remove_file(path).map_err(|source| Error::Io {
                        op: "remove empty compaction output",
                        path: path.clone(),
                        source,
                    })?;
                }
                return self.rewrite_fresh(kind, group);
            }
            other => other,
        };
        // A local file's footer is read back from disk; a streamed one's is the footer the
        // writer wrote (the upload hashed exactly those bytes).
        let info = match &path {
            Some(path) => footer::check_file(path)?,
            None => footer::check_metadata("the consolidated delta", metadata.file_metadata())?,
        };
        let written = Written {
            kind,
            path: path.clone(),
            rows: stats.rows,
            keys: stats.keys,
            changed: stats.changed.unwrap_or((0, 0)),
            columns: info.columns,
        };
        if stats.arrow_bytes > 0 {
            self.ratio = (size as f64 / stats.arrow_bytes as f64).clamp(0.01, 1.5);
        }
        if written.path.is_some() {
            self.waiting.push_back(size);
        }
        self.totals.files += 1;
        self.note_scratch();
        self.done
            .blocking_send(Done::Finished(written))
            .map_err(|_| Error::Invariant("the uploader stopped".into()))?;
        if let Some(group) = spilled {
            self.start(kind)?;
            self.slot(kind)
                .as_mut()
                .ok_or_else(|| Error::Invariant("no open output".into()))?
                .take_over(group)?;
        }
        Ok(())
    }

    /// Writes the rows of a repeated row group that did not fit even alone in a file as rows
    /// of no earlier row group: encoded whole and cut by size.
    fn rewrite_fresh(&mut self, kind: Kind, group: Finished) -> Result<()> {
        for b in group.held {
            let n = b.num_rows();
            self.write(kind, b, vec![Span::fresh(n)])?;
        }
        Ok(())
    }

    /// Closes `kind`'s open file and the one a row group it could not take started.
    fn finish_all(&mut self, kind: Kind) -> Result<()> {
        self.finish(kind)?;
        self.finish(kind)
    }
}

/// What the first `batch.num_rows()` rows of `spans` will add to a file whose encoded bytes
/// per Arrow byte are `ratio`: rows of a base row group a new base would repeat by that row
/// group's compressed bytes, the others by their Arrow bytes.
fn estimate(batch: &RecordBatch, spans: &[Span], ratio: f64) -> u64 {
    let rows = batch.num_rows();
    let (mut repeated, mut bytes, mut seen) = (0usize, 0u128, 0usize);
    for s in spans {
        if seen >= rows {
            break;
        }
        let len = s.len.min(rows - seen);
        if let Some((e, _)) = &s.from {
            repeated += len;
            bytes += u128::from(e.compressed_bytes()) * len as u128 / e.rows().max(1) as u128;
        }
        seen += len;
    }
    let others = if repeated < rows {
        batch_bytes(batch) as f64 * ratio * (rows - repeated) as f64 / rows as f64
    } else {
        0.0
    };
    (u64::try_from(bytes).unwrap_or(u64::MAX) + others as u64).max(1)
}

/// Whether the first `rows` rows of `spans` all come from base row groups a new base repeats.
fn repeats_only(spans: &[Span], rows: usize) -> bool {
    let mut seen = 0;
    for s in spans {
        if seen >= rows {
            break;
        }
        if s.from.is_none() {
            return false;
        }
        seen += s.len;
    }
    true
}

/// The compressed bytes of the base row group `span` starts, when a new base would repeat it.
fn starts_repeat(span: &Span) -> Option<u64> {
    match &span.from {
        Some((e, 0)) => Some(e.compressed_bytes()),
        _ => None,
    }
}

/// The row (of the batch `spans` cover) where the first span after the first starts a row
/// group a new base would repeat; past the last row when none does.
fn next_repeat(spans: &[Span]) -> usize {
    let mut at = spans.first().map_or(0, |s| s.len);
    for s in spans.iter().skip(1) {
        if starts_repeat(s).is_some() {
            return at;
        }
        at += s.len;
    }
    usize::MAX
}

/// Appends `span` (rows `pos..` of a row group cut into `runs`, or rows of no earlier row
/// group when it could not be cut) to `out` as spans of the runs it covers.
fn into_runs(runs: &[Arc<dyn Earlier>], pos: usize, span: Span, out: &mut Vec<Span>) {
    if runs.is_empty() {
        out.push(Span::fresh(span.len));
        return;
    }
    let (end, mut start) = (pos + span.len, 0);
    for run in runs {
        let stop = start + run.rows();
        let (a, b) = (pos.max(start), end.min(stop));
        if a < b {
            out.push(Span {
                len: b - a,
                from: Some((run.clone(), a - start)),
                changed: span.changed.clone(),
            });
        }
        start = stop;
    }
}

/// Cuts `spans` after `rows` rows: keeps the first part, returns the rest.
fn split_spans(spans: &mut Vec<Span>, rows: usize) -> Vec<Span> {
    let mut seen = 0;
    for i in 0..spans.len() {
        let len = spans[i].len;
        if seen + len > rows {
            let mut rest = spans.split_off(i);
            let inside = rows - seen;
            if inside > 0 {
                let mut head = rest[0].clone();
                head.len = inside;
                rest[0].len -= inside;
                if let Some((_, pos)) = rest[0].from.as_mut() {
                    *pos += inside;
                }
                spans.push(head);
            }
            return rest;
        }
        seen += len;
    }
    Vec::new()
}

/// A row group of a base, as the writer may repeat it.
impl Earlier for Group {
    fn rows(&self) -> usize {
        usize::try_from(self.source.meta.row_group(self.rg).num_rows()).unwrap_or(0)
    }

    fn compressed_bytes(&self) -> u64 {
        u64::try_from(self.source.meta.row_group(self.rg).compressed_size()).unwrap_or(0)
    }

    fn copyable(&self) -> bool {
        let src = &self.source;
        src.entry.tier == Tier::Base
            && src.offsets.is_some()
            && src
                .meta
                .file_metadata()
                .created_by()
                .is_some_and(|c| c.starts_with("parquet-rs"))
    }

    fn chunk(
        &self,
        field: &arrow::datatypes::Field,
        descr: &parquet::schema::types::ColumnDescriptor,
        _values: &[arrow::array::ArrayRef],
    ) -> Option<(parquet::column::writer::ColumnCloseResult, bytes::Bytes)> {
        let (meta, offsets) = pages::located(self, field, descr)?;
        let mut offsets = offsets.clone();
        let start = meta
            .dictionary_page_offset()
            .unwrap_or(meta.data_page_offset());
        let len = usize::try_from(meta.compressed_size()).ok()?;
        let bytes = self.data.get_bytes(u64::try_from(start).ok()?, len).ok()?;
        for page in &mut offsets.page_locations {
            page.offset -= start;
        }
        let metadata = meta
            .clone()
            .into_builder()
            .set_data_page_offset(meta.data_page_offset() - start)
            .set_dictionary_page_offset(meta.dictionary_page_offset().map(|d| d - start))
            .build()
            .ok()?;
        let close = parquet::column::writer::ColumnCloseResult {
            bytes_written: len as u64,
            rows_written: u64::try_from(self.rows()).ok()?,
            metadata,
            bloom_filter: None,
            column_index: None,
            offset_index: Some(offsets),
        };
        Some((close, bytes))
    }

    fn cut(self: Arc<Self>, first: u64, rest: u64) -> Vec<Arc<dyn Earlier>> {
        pages::runs(&self, first, rest)
    }
}

impl Open {
    /// Appends `batch` (its rows from `spans`); a row group the writer left for the next file
    /// comes back, with how many rows of `batch` it took.
    fn append(&mut self, batch: &RecordBatch, spans: &[Span]) -> Result<Option<Spill>> {
        let n = batch.num_rows();
        let (mut counted, mut at) = (0, 0);
        for s in spans {
            if matches!(s.from, Some((_, 0))) {
                self.stats.count(&batch.slice(counted, at - counted))?;
                counted = at;
                self.marks.push(self.stats.clone());
            }
            at += s.len;
        }
        self.stats.count(&batch.slice(counted, n - counted))?;
        // A row group never spans more than two marks back.
        if self.marks.len() > 4 {
            self.marks.drain(..self.marks.len() - 4);
        }
        let spill = self.writer.write(batch, spans)?;
        if let Some(s) = &spill {
            self.take_back(s.group.rows, n - s.taken)?;
        }
        Ok(spill)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_footer_margin_grows_with_columns_and_row_groups() {
        assert!(footer_margin(10, 0) < footer_margin(10, 5));
        assert!(footer_margin(10, 5) < footer_margin(40, 5));
    }
}
