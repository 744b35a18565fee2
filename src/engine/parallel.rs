//! A lake Parquet file whose columns are encoded on two threads: the caller's and a helper's
//! (docs/design.md §4.3). Encoding and compressing the columns is most of what a rewrite
//! costs; the columns of a row group are independent, so each thread encodes about half of
//! them (balanced by their Arrow size in the first batch) and the caller appends the finished
//! column chunks to the row group in schema order. The file is the same as
//! [`super::writer::open_lake_writer`]'s: the same properties, no Arrow schema in the footer.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use arrow::array::Array;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowSchemaConverter;
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves,
};
use parquet::errors::ParquetError;
use parquet::file::writer::SerializedFileWriter;

use super::ROW_GROUP_SIZE;
use super::writer::lake_properties;
use crate::error::{Error, Result};

/// A column's writer, by the column's position in the schema.
type Column = (usize, ArrowColumnWriter);

/// What the caller asks of the helper.
enum Ask {
    /// Encode these columns of the next row group.
    Start(Vec<Column>),
    /// Encode the helper's columns of these rows.
    Write(RecordBatch),
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

/// A lake Parquet file being written by two threads.
pub(crate) struct ParallelWriter {
    path: PathBuf,
    schema: SchemaRef,
    writer: SerializedFileWriter<File>,
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
            Ask::Write(batch) => write_columns(&schema, &mut columns, &batch).map(|()| {
                Answer::Written(
                    columns
                        .iter()
                        .map(|(_, w)| w.get_estimated_total_bytes() as u64)
                        .sum(),
                )
            }),
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

/// Encodes `columns` of `batch`.
fn write_columns(
    schema: &SchemaRef,
    columns: &mut [Column],
    batch: &RecordBatch,
) -> std::result::Result<(), ParquetError> {
    for (i, w) in columns.iter_mut() {
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
        let err = |e: ParquetError| Error::Parquet {
            path: path.display().to_string(),
            message: format!("open writer: {e}"),
        };
        let props = lake_properties(path, &schema)?;
        let parquet_schema = ArrowSchemaConverter::new()
            .with_coerce_types(props.coerce_types())
            .convert(&schema)
            .map_err(err)?;
        let file = crate::scratch::create_file(path).map_err(|source| Error::Io {
            op: "create parquet file",
            path: path.to_path_buf(),
            source,
        })?;
        let writer =
            SerializedFileWriter::new(file, parquet_schema.root_schema_ptr(), props.into())
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

    /// Writes `batch`, closing a row group every [`ROW_GROUP_SIZE`] rows.
    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.balance(batch)?;
        let mut at = 0;
        while at < batch.num_rows() {
            let take = (ROW_GROUP_SIZE - self.rows_in_group).min(batch.num_rows() - at);
            let part = batch.slice(at, take);
            self.ask(Ask::Write(part.clone()))?;
            let schema = self.schema.clone();
            let mine = write_columns(&schema, &mut self.mine, &part);
            let theirs = self.answer()?;
            mine.map_err(|e| self.parquet_error(e))?;
            if let Answer::Written(bytes) = theirs {
                self.helper_bytes = bytes;
            }
            self.rows_in_group += take;
            at += take;
            if self.rows_in_group == ROW_GROUP_SIZE {
                self.close_group()?;
                self.start_group()?;
            }
        }
        Ok(())
    }

    /// Appends the row group's column chunks, in schema order.
    fn close_group(&mut self) -> Result<()> {
        self.ask(Ask::Close)?;
        let mut chunks: Vec<(usize, ArrowColumnChunk)> = Vec::new();
        for (i, w) in std::mem::take(&mut self.mine) {
            chunks.push((i, w.close().map_err(|e| self.parquet_error(e))?));
        }
        if let Answer::Closed(theirs) = self.answer()? {
            chunks.extend(theirs);
        }
        chunks.sort_unstable_by_key(|(i, _)| *i);
        let path = self.path.display().to_string();
        let err = |e: ParquetError| Error::Parquet {
            path: path.clone(),
            message: format!("write: {e}"),
        };
        let mut group = self.writer.next_row_group().map_err(err)?;
        for (_, chunk) in chunks {
            chunk.append_to_row_group(&mut group).map_err(err)?;
        }
        group.close().map_err(err)?;
        self.groups += 1;
        self.rows_in_group = 0;
        Ok(())
    }

    /// Bytes written to the file so far (finished row groups).
    pub(crate) fn bytes_written(&self) -> u64 {
        self.writer.bytes_written() as u64
    }

    /// The encoders' estimate of the row group in progress.
    pub(crate) fn in_progress_size(&self) -> u64 {
        let mine: u64 = self
            .mine
            .iter()
            .map(|(_, w)| w.get_estimated_total_bytes() as u64)
            .sum();
        mine + self.helper_bytes
    }

    /// Finished row groups.
    pub(crate) fn row_groups(&self) -> usize {
        self.groups
    }

    /// Writes the last row group and the footer.
    pub(crate) fn close(mut self) -> Result<()> {
        if self.rows_in_group > 0 {
            self.close_group()?;
        }
        self.asks = None;
        if let Some(h) = self.helper.take() {
            let _ = h.join();
        }
        self.writer.close().map_err(|e| Error::Parquet {
            path: self.path.display().to_string(),
            message: format!("write: {e}"),
        })?;
        Ok(())
    }
}
