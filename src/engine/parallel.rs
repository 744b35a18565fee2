//! A lake Parquet file whose columns are encoded on two threads: the caller's and a helper's
//! (docs/design.md §4.3). Encoding and compressing the columns is most of what a rewrite
//! costs; the columns of a row group are independent, so each thread encodes about half of
//! them (balanced by their Arrow size in the first batch) and the caller appends the finished
//! column chunks to the row group in schema order. The file is the same as
//! [`super::writer::open_lake_writer`]'s: the same properties, no Arrow schema in the footer.
//!
//! A rewrite mostly repeats what its sources hold: a base row group a delta changes a few rows
//! of comes out with the same rows in the same order, and most of its columns unchanged. The
//! caller says where its rows come from ([`Span`]); a new row group that repeats an earlier
//! one ([`Earlier`]) row for row is held back unencoded until it is complete, and then its
//! unchanged columns are copied from the earlier file as they are (compressed bytes, page
//! offsets rebased) and only the changed ones are encoded (docs/design.md §9). A row group
//! such a repeat would join starts a new row group, so that row groups line up with their
//! sources'.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::{Field, SchemaRef};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use parquet::arrow::ArrowSchemaConverter;
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves,
};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::{ColumnDescriptor, ColumnPath};

use super::ROW_GROUP_SIZE;
use super::writer::lake_properties;
use crate::error::{Error, Result};
use crate::scratch::Piecewise;

/// A column's writer, by the column's position in the schema.
type Column = (usize, ArrowColumnWriter);

/// A row group of an earlier lake file, which a new row group may repeat row for row.
pub(crate) trait Earlier: Send + Sync {
    /// Rows in it.
    fn rows(&self) -> usize;
    /// Its compressed bytes.
    fn compressed_bytes(&self) -> u64;
    /// Whether its chunks may be copied at all (a file this writer's settings wrote, whose
    /// page offsets are known).
    fn copyable(&self) -> bool;
    /// Its chunk of column `field`, when it is stored exactly as a new file stores it
    /// (`descr`): what closing a writer of `values` (the column's values of its rows, in
    /// parts) would have returned, its offsets relative to the returned bytes, which are the
    /// chunk's.
    fn chunk(
        &self,
        field: &Field,
        descr: &ColumnDescriptor,
        values: &[ArrayRef],
    ) -> Option<(ColumnCloseResult, Bytes)>;
    /// Cuts it into consecutive parts a new file may repeat one by one, the first of at most
    /// `first` compressed bytes (unless even its smallest part is larger), the others of at
    /// most `rest`; empty when it cannot be cut.
    fn cut(self: Arc<Self>, first: u64, rest: u64) -> Vec<Arc<dyn Earlier>> {
        let _ = (first, rest);
        Vec::new()
    }
}

/// The fewest rows a base row group must hold for new bases to line up with it by default: a
/// quarter of the usual rows, so that lining up never leaves a file of small row groups.
pub const MIN_REPEAT_ROWS: usize = ROW_GROUP_SIZE / 4;

/// Whether a new row group should line up with `earlier` to repeat it: a copyable row group of
/// `min_rows` rows or more (and no more than a row group holds).
pub(crate) fn worth_repeating(earlier: &dyn Earlier, min_rows: usize) -> bool {
    (min_rows..=ROW_GROUP_SIZE).contains(&earlier.rows()) && earlier.copyable()
}

/// Where rows handed to [`ParallelWriter::write`] come from.
#[derive(Clone)]
pub(crate) struct Span {
    /// Rows of the batch it covers, following the span before it.
    pub len: usize,
    /// Rows `pos..pos + len` of an earlier row group worth repeating ([`worth_repeating`]), or
    /// copies that replace them; none for rows no such row group holds at that place.
    pub from: Option<(Arc<dyn Earlier>, usize)>,
    /// Columns (by position) where these rows differ from the earlier row group's.
    pub changed: Vec<usize>,
}

impl Span {
    /// Rows of no earlier row group.
    pub(crate) fn fresh(len: usize) -> Self {
        Self {
            len,
            from: None,
            changed: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Span")
            .field("len", &self.len)
            .field("pos", &self.from.as_ref().map(|(_, p)| *p))
            .field("changed", &self.changed)
            .finish()
    }
}

/// The bytes a file's footer may take beyond its row groups: per column and row group (a
/// column chunk's metadata and statistics take about 100 bytes).
pub(crate) fn footer_margin(columns: usize, row_groups: usize) -> u64 {
    1024 + 160 * (columns as u64) * (row_groups as u64 + 1)
}

/// Column `field`'s `parts` (one flat column's values, in parts) encoded as a column chunk of
/// their own, with the lake's settings but no dictionary: the pages a run's chunk encodes
/// before and after the earlier file's plain pages it copies (docs/design.md §9). Its offsets
/// are relative to the returned bytes, which are the chunk's; None if the parquet writer
/// fails (the caller then encodes the whole column).
pub(crate) fn plain_chunk(field: &Field, parts: &[ArrayRef]) -> Option<(ColumnCloseResult, Bytes)> {
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![field.clone()]));
    let props = lake_properties(Path::new(field.name()), &schema)
        .ok()?
        .into_builder()
        .set_column_dictionary_enabled(ColumnPath::from(field.name().as_str()), false)
        .build();
    let parquet_schema = ArrowSchemaConverter::new()
        .with_coerce_types(props.coerce_types())
        .convert(&schema)
        .ok()?;
    let mut file =
        SerializedFileWriter::new(Vec::new(), parquet_schema.root_schema_ptr(), props.into())
            .ok()?;
    let factory = ArrowRowGroupWriterFactory::new(&file, schema.clone());
    let mut writer = factory.create_column_writers(0).ok()?.pop()?;
    for part in parts {
        for leaf in compute_leaves(schema.field(0), part).ok()? {
            writer.write(&leaf).ok()?;
        }
    }
    let chunk = writer.close().ok()?;
    let close = chunk.close().clone();
    // The chunk's bytes: the last ones of the in-memory file once a row group holds it.
    let mut group = file.next_row_group().ok()?;
    chunk.append_to_row_group(&mut group).ok()?;
    group.close().ok()?;
    file.flush().ok()?;
    let written = file.inner();
    let len = usize::try_from(close.metadata.compressed_size()).ok()?;
    let bytes = written.get(written.len().checked_sub(len)?..)?;
    Some((close, Bytes::copy_from_slice(bytes)))
}

/// A column chunk of a finished row group.
enum Chunk {
    /// Encoded here.
    Encoded(Box<ArrowColumnChunk>),
    /// An earlier file's, as it is (offsets relative to its bytes).
    Copied(Box<ColumnCloseResult>, Bytes),
}

/// A row group finished but not yet in a file: one that repeats an earlier row group and did
/// not fit in the file it was written for.
pub(crate) struct Finished {
    chunks: Vec<Chunk>,
    /// Its rows.
    pub rows: usize,
    /// The rows themselves (what the file's own figures are counted from).
    pub held: Vec<RecordBatch>,
}

impl Finished {
    /// Its bytes in a file: its chunks, and their offset indexes (about 24 bytes a page),
    /// which are written before the footer.
    fn bytes(&self) -> u64 {
        self.chunks
            .iter()
            .map(|c| {
                let close = match c {
                    Chunk::Encoded(e) => e.close(),
                    Chunk::Copied(close, _) => close.as_ref(),
                };
                let pages = close
                    .offset_index
                    .as_ref()
                    .map_or(0, |o| o.page_locations.len());
                u64::try_from(close.metadata.compressed_size()).unwrap_or(0)
                    + 24 * pages as u64
                    + 16
            })
            .sum()
    }
}

/// A row group [`ParallelWriter::write`] left for the next file, and how many rows of the
/// batch it had taken (the group's last row among them); the rest of the batch was not
/// written.
pub(crate) struct Spill {
    pub taken: usize,
    pub group: Finished,
}

/// What the row group being written is so far.
enum Track {
    /// Empty.
    Fresh,
    /// Rows `0..next` of `earlier`, in order; `changed` marks the columns that differ.
    Repeat {
        earlier: Arc<dyn Earlier>,
        next: usize,
        changed: Vec<bool>,
    },
    /// Anything else: every column is encoded.
    Mixed,
}

/// What the caller asks of the helper.
enum Ask {
    /// Encode these columns of the next row group.
    Start(Vec<Column>),
    /// Encode the helper's columns of these rows (only those marked, when given).
    Write(RecordBatch, Option<Arc<Vec<bool>>>),
    /// Close the helper's columns of the row group.
    Close,
}

/// What the helper answers.
enum Answer {
    /// The rows were encoded; the helper's columns now hold about this many bytes.
    Written(u64),
    /// The helper's finished column chunks, by column position.
    Closed(Vec<(usize, ArrowColumnChunk)>),
}

/// Where a streamed file's bytes go (a streamed upload, docs/design.md §9): written in order,
/// then ended once the footer is written.
pub(crate) trait Stream: std::io::Write + Send {
    /// The file is complete: everything written so far is the whole file.
    fn end(&mut self) -> std::io::Result<()>;
}

/// A local file is complete once written.
impl Stream for Piecewise<File> {
    fn end(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A closed [`ParallelWriter`]'s file.
pub(crate) struct Closed {
    /// Column chunks copied as they are.
    pub copied: usize,
    /// The last row group, when it did not fit (for the next file).
    pub spilled: Option<Finished>,
    /// The footer written.
    pub metadata: ParquetMetaData,
    /// The file's bytes.
    pub size: u64,
}

/// A lake Parquet file being written by two threads.
pub(crate) struct ParallelWriter {
    /// The file, or what the streamed upload is called in messages.
    path: PathBuf,
    schema: SchemaRef,
    writer: SerializedFileWriter<Box<dyn Stream>>,
    factory: ArrowRowGroupWriterFactory,
    /// The columns this thread encodes.
    mine: Vec<Column>,
    /// Per column: encoded by the helper.
    helped: Vec<bool>,
    asks: Option<Sender<Ask>>,
    answers: Receiver<std::result::Result<Answer, ParquetError>>,
    helper: Option<JoinHandle<()>>,
    /// The helper's last estimate of its columns' bytes.
    helper_bytes: u64,
    rows_in_group: usize,
    groups: usize,
    /// What the row group in progress repeats, if anything.
    track: Track,
    /// Its rows not encoded yet (while it repeats an earlier row group).
    held: Vec<RecordBatch>,
    /// Column chunks copied as they are, over the file's life.
    copied: usize,
    /// The most bytes the file may take ([`ParallelWriter::set_limit`]).
    limit: Option<u64>,
}

fn helper_loop(
    schema: SchemaRef,
    asks: Receiver<Ask>,
    answers: Sender<std::result::Result<Answer, ParquetError>>,
) {
    let mut columns: Vec<Column> = Vec::new();
    for ask in asks {
        let answer = match ask {
            Ask::Start(c) => {
                columns = c;
                continue;
            }
            Ask::Write(batch, only) => {
                write_columns(&schema, &mut columns, &batch, only.as_deref()).map(|()| {
                    Answer::Written(
                        columns
                            .iter()
                            .map(|(_, w)| w.get_estimated_total_bytes() as u64)
                            .sum(),
                    )
                })
            }
            Ask::Close => std::mem::take(&mut columns)
                .into_iter()
                .map(|(i, w)| w.close().map(|chunk| (i, chunk)))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(Answer::Closed),
        };
        if answers.send(answer).is_err() {
            return;
        }
    }
}

/// Encodes `columns` of `batch` (those marked in `only`, when given).
fn write_columns(
    schema: &SchemaRef,
    columns: &mut [Column],
    batch: &RecordBatch,
    only: Option<&Vec<bool>>,
) -> std::result::Result<(), ParquetError> {
    for (i, w) in columns.iter_mut() {
        if only.is_some_and(|o| !o.get(*i).copied().unwrap_or(true)) {
            continue;
        }
        let leaves = compute_leaves(schema.field(*i), batch.column(*i))?;
        for leaf in leaves {
            w.write(&leaf)?;
        }
    }
    Ok(())
}

impl ParallelWriter {
    /// Creates `path` (0600, new) for batches of `schema`.
    pub(crate) fn create(path: &Path, schema: SchemaRef) -> Result<Self> {
        let file = crate::scratch::create_writer(path).map_err(|source| Error::Io {
            op: "create parquet file",
            path: path.to_path_buf(),
            source,
        })?;
        Self::streamed(path, Box::new(file), schema)
    }

    /// A file of batches of `schema` written to `sink` as it is made (`path` names it in
    /// messages); [`ParallelWriter::close`] ends it.
    pub(crate) fn streamed(path: &Path, sink: Box<dyn Stream>, schema: SchemaRef) -> Result<Self> {
        let err = |e: ParquetError| Error::Parquet {
            path: path.display().to_string(),
            message: format!("open writer: {e}"),
        };
        let props = lake_properties(path, &schema)?;
        let parquet_schema = ArrowSchemaConverter::new()
            .with_coerce_types(props.coerce_types())
            .convert(&schema)
            .map_err(err)?;
        let writer =
            SerializedFileWriter::new(sink, parquet_schema.root_schema_ptr(), props.into())
                .map_err(err)?;
        let factory = ArrowRowGroupWriterFactory::new(&writer, schema.clone());
        let (ask_tx, ask_rx) = channel();
        let (answer_tx, answer_rx) = channel();
        let helper_schema = schema.clone();
        let helper = std::thread::Builder::new()
            .name("lakecdc-encode".into())
            .spawn(move || helper_loop(helper_schema, ask_rx, answer_tx))
            .map_err(|source| Error::Io {
                op: "start an encoding thread for",
                path: path.to_path_buf(),
                source,
            })?;
        let mut out = Self {
            path: path.to_path_buf(),
            helped: vec![false; schema.fields().len()],
            schema,
            writer,
            factory,
            mine: Vec::new(),
            asks: Some(ask_tx),
            answers: answer_rx,
            helper: Some(helper),
            helper_bytes: 0,
            rows_in_group: 0,
            groups: 0,
            track: Track::Fresh,
            held: Vec::new(),
            copied: 0,
            limit: None,
        };
        out.start_group()?;
        Ok(out)
    }

    fn parquet_error(&self, e: ParquetError) -> Error {
        Error::Parquet {
            path: self.path.display().to_string(),
            message: format!("write: {e}"),
        }
    }

    fn ask(&self, ask: Ask) -> Result<()> {
        self.asks
            .as_ref()
            .and_then(|a| a.send(ask).ok())
            .ok_or_else(|| Error::Invariant("the encoding thread stopped".into()))
    }

    fn answer(&self) -> Result<Answer> {
        match self.answers.recv() {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(e)) => Err(self.parquet_error(e)),
            Err(_) => Err(Error::Invariant("the encoding thread stopped".into())),
        }
    }

    /// Column writers for the next row group, split between the two threads.
    fn start_group(&mut self) -> Result<()> {
        let writers = self
            .factory
            .create_column_writers(self.groups)
            .map_err(|e| self.parquet_error(e))?;
        if writers.len() != self.schema.fields().len() {
            return Err(Error::Invariant(format!(
                "{} column writers for {} columns: every lake column has one leaf",
                writers.len(),
                self.schema.fields().len()
            )));
        }
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        for (i, w) in writers.into_iter().enumerate() {
            if self.helped[i] {
                theirs.push((i, w));
            } else {
                mine.push((i, w));
            }
        }
        self.mine = mine;
        self.helper_bytes = 0;
        self.ask(Ask::Start(theirs))
    }

    /// Splits the columns between the threads by their size in `batch` (first batch only).
    fn balance(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.groups > 0 || self.rows_in_group > 0 {
            return Ok(());
        }
        let mut sizes: Vec<(u64, usize)> = batch
            .columns()
            .iter()
            .enumerate()
            .map(|(i, c)| (c.get_array_memory_size() as u64, i))
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let (mut here, mut there) = (0u64, 0u64);
        let mut helped = vec![false; sizes.len()];
        for (size, i) in sizes {
            if there < here {
                helped[i] = true;
                there += size;
            } else {
                here += size;
            }
        }
        if helped != self.helped {
            self.helped = helped;
            // Nothing was written yet: the writers are handed out again.
            self.ask(Ask::Close)?;
            let _ = self.answer()?;
            self.start_group()?;
        }
        Ok(())
    }

    /// Writes `batch`, whose rows come from `spans` (none: from no earlier row group),
    /// closing a row group every [`ROW_GROUP_SIZE`] rows, once it repeats an earlier one
    /// completely, and before rows that start repeating one.
    pub(crate) fn write(&mut self, batch: &RecordBatch, spans: &[Span]) -> Result<Option<Spill>> {
        self.balance(batch)?;
        let whole = [Span::fresh(batch.num_rows())];
        let spans = if spans.is_empty() { &whole[..] } else { spans };
        if spans.iter().map(|s| s.len).sum::<usize>() != batch.num_rows() {
            return Err(Error::Invariant(
                "the spans of a batch do not cover its rows".into(),
            ));
        }
        // Rows of `batch` handed to the row group so far, and rows accounted for.
        let (mut fed, mut at) = (0, 0);
        for span in spans {
            let mut done = 0;
            while done < span.len {
                let starts = matches!(&span.from, Some((_, 0)) if done == 0);
                if self.rows_in_group > 0 && (starts || self.repeated()) {
                    if let Some(group) = self.cut(batch, fed, at)? {
                        return Ok(Some(Spill { taken: at, group }));
                    }
                    fed = at;
                }
                let take = (span.len - done).min(ROW_GROUP_SIZE - self.rows_in_group);
                self.follow(span, done, take);
                self.rows_in_group += take;
                at += take;
                done += take;
                if self.rows_in_group == ROW_GROUP_SIZE {
                    if let Some(group) = self.cut(batch, fed, at)? {
                        return Ok(Some(Spill { taken: at, group }));
                    }
                    fed = at;
                }
            }
        }
        self.feed(batch, fed, at)?;
        Ok(None)
    }

    /// Ends the row group in progress after rows `from..to` of `batch` and starts the next;
    /// returns the row group when it was left for the next file.
    fn cut(&mut self, batch: &RecordBatch, from: usize, to: usize) -> Result<Option<Finished>> {
        self.feed(batch, from, to)?;
        let spilled = self.close_group()?;
        self.start_group()?;
        Ok(spilled)
    }

    /// Whether the row group in progress repeats an earlier one completely.
    fn repeated(&self) -> bool {
        matches!(&self.track, Track::Repeat { earlier, next, .. } if *next == earlier.rows())
    }

    /// Notes that `take` rows of `span` from its row `done` join the row group.
    fn follow(&mut self, span: &Span, done: usize, take: usize) {
        let columns = self.schema.fields().len();
        match (&mut self.track, &span.from) {
            (Track::Fresh, Some((e, 0))) if done == 0 => {
                let mut changed = vec![false; columns];
                for &c in &span.changed {
                    if let Some(m) = changed.get_mut(c) {
                        *m = true;
                    }
                }
                self.track = Track::Repeat {
                    earlier: e.clone(),
                    next: take,
                    changed,
                };
            }
            (
                Track::Repeat {
                    earlier,
                    next,
                    changed,
                },
                Some((e, pos)),
            ) if Arc::ptr_eq(earlier, e) && pos + done == *next => {
                *next += take;
                for &c in &span.changed {
                    if let Some(m) = changed.get_mut(c) {
                        *m = true;
                    }
                }
            }
            _ => self.track = Track::Mixed,
        }
    }

    /// Hands rows `from..to` of `batch` to the row group: held while it repeats an earlier
    /// one, else encoded (after any rows held before it stopped repeating).
    fn feed(&mut self, batch: &RecordBatch, from: usize, to: usize) -> Result<()> {
        if matches!(self.track, Track::Repeat { .. }) {
            if to > from {
                self.held.push(batch.slice(from, to - from));
            }
            return Ok(());
        }
        for held in std::mem::take(&mut self.held) {
            self.encode(&held, None)?;
        }
        if to > from {
            self.encode(&batch.slice(from, to - from), None)?;
        }
        Ok(())
    }

    /// Encodes `part` (of the columns marked in `only`, when given) on both threads.
    fn encode(&mut self, part: &RecordBatch, only: Option<Arc<Vec<bool>>>) -> Result<()> {
        self.ask(Ask::Write(part.clone(), only.clone()))?;
        let schema = self.schema.clone();
        let mine = write_columns(&schema, &mut self.mine, part, only.as_deref());
        let theirs = self.answer()?;
        mine.map_err(|e| self.parquet_error(e))?;
        if let Answer::Written(bytes) = theirs {
            self.helper_bytes = bytes;
        }
        Ok(())
    }

    /// The chunks of the row group in progress to copy, by column: the unchanged columns
    /// of the earlier row group it repeats completely; none otherwise.
    fn copies(&self, track: &Track) -> Vec<Option<(ColumnCloseResult, Bytes)>> {
        let columns = self.schema.fields().len();
        let Track::Repeat {
            earlier,
            next,
            changed,
        } = track
        else {
            return (0..columns).map(|_| None).collect();
        };
        if *next != earlier.rows() {
            return (0..columns).map(|_| None).collect();
        }
        let descr = self.writer.schema_descr();
        (0..columns)
            .map(|i| {
                if changed.get(i).copied().unwrap_or(true) {
                    return None;
                }
                let field = self.schema.field(i);
                let values: Vec<ArrayRef> = self.held.iter().map(|b| b.column(i).clone()).collect();
                earlier.chunk(field, descr.column(i).as_ref(), &values)
            })
            .collect()
    }

    /// Finishes the row group in progress: copied chunks as they are, the others encoded
    /// (held rows first), appended to the file in schema order — unless it repeats an earlier
    /// row group and would take the file past its limit ([`ParallelWriter::set_limit`]): it
    /// is then returned, to start the next file (or, alone in its file, to be written again
    /// as rows the writer cuts by size).
    fn close_group(&mut self) -> Result<Option<Finished>> {
        let track = std::mem::replace(&mut self.track, Track::Fresh);
        let repeated =
            matches!(&track, Track::Repeat { earlier, next, .. } if *next == earlier.rows());
        let copies = self.copies(&track);
        let held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            let only = Arc::new(copies.iter().map(Option::is_none).collect::<Vec<_>>());
            for part in &held {
                self.encode(part, Some(only.clone()))?;
            }
        }
        self.ask(Ask::Close)?;
        let mut encoded: Vec<(usize, ArrowColumnChunk)> = Vec::new();
        for (i, w) in std::mem::take(&mut self.mine) {
            encoded.push((i, w.close().map_err(|e| self.parquet_error(e))?));
        }
        if let Answer::Closed(theirs) = self.answer()? {
            encoded.extend(theirs);
        }
        encoded.sort_unstable_by_key(|(i, _)| *i);
        let chunks: Vec<Chunk> = encoded
            .into_iter()
            .zip(copies)
            .map(|((_, chunk), copy)| match copy {
                Some((close, bytes)) => Chunk::Copied(Box::new(close), bytes),
                None => Chunk::Encoded(Box::new(chunk)),
            })
            .collect();
        let group = Finished {
            chunks,
            rows: std::mem::take(&mut self.rows_in_group),
            held,
        };
        let over = self.limit.is_some_and(|limit| {
            let after = self.bytes_written()
                + group.bytes()
                + footer_margin(self.schema.fields().len(), self.groups + 1);
            after > limit
        });
        if repeated && over {
            return Ok(Some(group));
        }
        self.append(group)?;
        Ok(None)
    }

    /// Appends a finished row group (of this file, or one the file before could not take).
    pub(crate) fn append(&mut self, group: Finished) -> Result<()> {
        let path = self.path.display().to_string();
        let err = |e: ParquetError| Error::Parquet {
            path: path.clone(),
            message: format!("write: {e}"),
        };
        let mut out = self.writer.next_row_group().map_err(err)?;
        for chunk in group.chunks {
            match chunk {
                Chunk::Copied(close, bytes) => {
                    out.append_column(&bytes, *close).map_err(err)?;
                    self.copied += 1;
                }
                Chunk::Encoded(chunk) => chunk.append_to_row_group(&mut out).map_err(err)?,
            }
        }
        out.close().map_err(err)?;
        self.groups += 1;
        Ok(())
    }

    /// Caps the file's bytes (its footer included, as [`footer_margin`] estimates it): a
    /// row group that repeats an earlier one and would pass the cap after other row groups
    /// is left for the next file instead (see [`Spill`]).
    pub(crate) fn set_limit(&mut self, bytes: u64) {
        self.limit = Some(bytes);
    }

    /// Bytes written to the file so far (finished row groups).
    pub(crate) fn bytes_written(&self) -> u64 {
        self.writer.bytes_written() as u64
    }

    /// The encoders' estimate of the row group in progress (for rows held back, the share
    /// of the earlier row group they repeat).
    pub(crate) fn in_progress_size(&self) -> u64 {
        let mine: u64 = self
            .mine
            .iter()
            .map(|(_, w)| w.get_estimated_total_bytes() as u64)
            .sum();
        let held = match &self.track {
            Track::Repeat { earlier, next, .. } if earlier.rows() > 0 => {
                let share =
                    u128::from(earlier.compressed_bytes()) * *next as u128 / earlier.rows() as u128;
                u64::try_from(share).unwrap_or(u64::MAX)
            }
            _ => 0,
        };
        mine + self.helper_bytes + held
    }

    /// Finished row groups.
    pub(crate) fn row_groups(&self) -> usize {
        self.groups
    }

    /// Writes the last row group and the footer (and ends a streamed upload's object);
    /// returns how many column chunks were copied as they are, the last row group when it did
    /// not fit (for the next file), the footer and the file's size.
    pub(crate) fn close(mut self) -> Result<Closed> {
        let spilled = if self.rows_in_group > 0 {
            self.close_group()?
        } else {
            None
        };
        self.asks = None;
        if let Some(h) = self.helper.take() {
            let _ = h.join();
        }
        let metadata = self.writer.finish().map_err(|e| self.parquet_error(e))?;
        let size = self.writer.bytes_written() as u64;
        let ended = self.writer.inner_mut().end();
        ended.map_err(|e| self.parquet_error(e.into()))?;
        Ok(Closed {
            copied: self.copied,
            spilled,
            metadata,
            size,
        })
    }
}
