//! The files a compaction writes (docs/design.md §9): new bases, each cut before it would pass
//! `--target-base-size` and wherever the merge leaves a kept range between two rewritten
//! ones, and at most one consolidated delta. Runs on its own thread, fed by the merge; each
//! finished file goes to the uploader at once, and a new file is only started once at most
//! one finished file is still waiting for its upload, so local disk holds at most the files
//! being written and one being uploaded, whatever the schema's size.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, SchemaRef};
use tokio::sync::mpsc;

use crate::engine::parallel::ParallelWriter;
use crate::error::{Error, Result};
use crate::lake::footer;
use crate::lake::ranges::{Key, key};

/// Which output a batch goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A new base file.
    Base,
    /// The consolidated delta.
    Delta,
}

/// What the merge sends the writer.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Rows for an output, sorted by `row_id`, after every row sent before.
    Rows(Kind, RecordBatch),
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
    /// The local file.
    pub path: PathBuf,
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
}

/// An output file being written.
struct Open {
    kind: Kind,
    path: PathBuf,
    writer: ParallelWriter,
    rows: u64,
    /// Arrow bytes appended (what [`Open::ratio`] compares the encoded bytes with).
    arrow_bytes: u64,
    keys: Option<(Key, Key)>,
    changed: Option<(i64, i64)>,
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
        if self.arrow_bytes == 0 {
            return 1.0;
        }
        (self.encoded() as f64 / self.arrow_bytes as f64).clamp(0.01, 1.5)
    }
}

/// The writer thread's state.
pub(crate) struct Outputs {
    dir: PathBuf,
    schema: SchemaRef,
    target: u64,
    base: Option<Open>,
    delta: Option<Open>,
    next: usize,
    done: mpsc::Sender<Written>,
    /// One message per upload finished, in the order the files were handed over.
    acks: Receiver<()>,
    /// Sizes of finished files not yet uploaded (their local copies still exist), oldest first.
    waiting: VecDeque<u64>,
    totals: Totals,
}

/// The bytes a file's footer may take beyond its row groups: per column and row group (a
/// column chunk's metadata and statistics take about 100 bytes).
fn footer_margin(columns: usize, row_groups: usize) -> u64 {
    1024 + 160 * (columns as u64) * (row_groups as u64 + 1)
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
        done: mpsc::Sender<Written>,
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
        }
    }

    /// Serves the merge's messages until [`Msg::End`]; a merge that hangs up without it
    /// failed, and nothing more is finished.
    pub(crate) fn serve(mut self, rx: Receiver<Msg>) -> Result<Totals> {
        loop {
            let msg = rx.recv().map_err(|_| {
                Error::Invariant("the merge ended without finishing its outputs".into())
            })?;
            match msg {
                Msg::Rows(kind, batch) => self.write(kind, batch)?,
                Msg::Cut => self.finish(Kind::Base)?,
                Msg::End { zero_row_base } => {
                    self.finish(Kind::Base)?;
                    self.finish(Kind::Delta)?;
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

    /// Local bytes now: the finished files waiting for upload and the open ones.
    fn note_scratch(&mut self) {
        let open: u64 = [&self.base, &self.delta]
            .iter()
            .filter_map(|o| o.as_ref())
            .map(|o| o.writer.bytes_written())
            .sum();
        let now = open + self.waiting.iter().sum::<u64>();
        self.totals.scratch_peak = self.totals.scratch_peak.max(now);
    }

    /// Opens a new file of `kind`, first waiting until at most one finished file is still
    /// being uploaded.
    fn start(&mut self, kind: Kind) -> Result<()> {
        while self.waiting.len() > 1 {
            self.wait_for_upload()?;
        }
        let path = self.dir.join(format!("out-{}.parquet", self.next));
        self.next += 1;
        let writer = ParallelWriter::create(&path, self.schema.clone())?;
        *self.slot(kind) = Some(Open {
            kind,
            path,
            writer,
            rows: 0,
            arrow_bytes: 0,
            keys: None,
            changed: None,
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
    fn write(&mut self, kind: Kind, batch: RecordBatch) -> Result<()> {
        let mut rest = batch;
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
            let take = if kind == Kind::Base {
                let used =
                    open.encoded() + footer_margin(rest.num_columns(), open.writer.row_groups());
                // 5% is kept for estimates that fall short.
                let room = (target - target / 20).saturating_sub(used);
                let need = ((batch_bytes(&rest) as f64 * open.ratio()) as u64).max(1);
                if need <= room {
                    rows
                } else {
                    let fit = usize::try_from(u128::from(room) * rows as u128 / u128::from(need))
                        .unwrap_or(rows);
                    // A file holds at least one row, however small the target.
                    if fit == 0 && open.rows == 0 { 1 } else { fit }
                }
            } else {
                rows
            };
            if take > 0 {
                let part = rest.slice(0, take);
                open.append(&part)?;
                rest = rest.slice(take, rows - take);
            }
            if rest.num_rows() > 0 {
                self.finish(kind)?;
            }
            self.note_scratch();
        }
        Ok(())
    }

    /// Closes `kind`'s open file, if any, and hands it to the uploader.
    fn finish(&mut self, kind: Kind) -> Result<()> {
        let Some(open) = self.slot(kind).take() else {
            return Ok(());
        };
        let path = open.path.clone();
        open.writer.close()?;
        let info = footer::check_file(&path)?;
        let size = std::fs::metadata(&path)
            .map_err(|source| Error::Io {
                op: "measure compaction output",
                path: path.clone(),
                source,
            })?
            .len();
        let written = Written {
            kind: open.kind,
            path: path.clone(),
            rows: open.rows,
            keys: open.keys,
            changed: open.changed.unwrap_or((0, 0)),
            columns: info.columns,
        };
        self.waiting.push_back(size);
        self.totals.files += 1;
        self.note_scratch();
        self.done
            .blocking_send(written)
            .map_err(|_| Error::Invariant("the uploader stopped".into()))?;
        Ok(())
    }
}

impl Open {
    fn append(&mut self, batch: &RecordBatch) -> Result<()> {
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
        self.writer.write(batch)?;
        self.rows += n as u64;
        self.arrow_bytes += batch_bytes(batch);
        Ok(())
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
