//! A listed file read without downloading it (compaction's sources, docs/design.md §9): its
//! footer by one ranged read of its last bytes, then its row groups one at a time, in file order, each
//! by one ranged read. Every byte the merge decodes is hashed, in order, and the hash is
//! compared with the manifest's checksum once the file's last byte has passed: a corrupt or
//! replaced source fails the pass before anything is published. A stream opens each of its
//! later files while the one before it streams and lets each go once read, so memory is two
//! footers and the row groups in flight per stream, however many files the pass merges; local
//! disk, none.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use bytes::{Buf, Bytes};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::errors::ParquetError;
use parquet::file::FOOTER_SIZE;
use parquet::file::metadata::{
    FooterTail, PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader, ParquetOffsetIndex,
};
use parquet::file::reader::{ChunkReader, Length};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::footer;
use super::manifest::{FileEntry, Tier};
use crate::error::{Error, Result};
use crate::store::ObjectStore;

/// Rows per decoded batch.
pub(crate) const BATCH_ROWS: usize = 8192;

/// How many bytes of a file's end the first read takes: the footer of every file lakecdc
/// writes fits, so one request reads it.
const TAIL_BYTES: u64 = 256 * 1024;

/// A source's footer, read and checked.
#[derive(Debug)]
pub(crate) struct Source {
    /// Its manifest entry.
    pub entry: FileEntry,
    /// Its size in bytes (as listed).
    pub size: u64,
    /// Where [`Source::tail`] starts.
    tail_start: u64,
    /// The file's last bytes: the footer and whatever precedes it.
    tail: Bytes,
    /// The parsed footer.
    pub meta: Arc<ParquetMetaData>,
    /// The footer as Arrow sees it.
    pub arrow: ArrowReaderMetadata,
    /// A base's column chunks' offset indexes (`[row group][column]`), when the file's last
    /// bytes hold them: what a column chunk copied as it is carries into a new file (see
    /// [`Group`]); none for a delta.
    pub offsets: Option<ParquetOffsetIndex>,
}

fn corrupt(f: &FileEntry, message: impl Into<String>) -> Error {
    Error::Parquet {
        path: f.path.clone(),
        message: message.into(),
    }
}

/// Sizes a listed file and reads its footer. An object larger than its entry lists is
/// refused before any of it is read (docs/hazards.md S2); the system columns must be there.
pub(crate) async fn open(store: &dyn ObjectStore, f: &FileEntry) -> Result<Source> {
    let meta = store
        .head(&f.path)
        .await
        .map_err(Error::storage("read compaction source", f.path.clone()))?;
    let listed = u64::try_from(f.size_bytes).unwrap_or(0);
    let size = match listed {
        0 => meta.size,
        n if meta.size > n => {
            return Err(Error::TooLarge {
                what: "compaction source",
                key: f.path.clone(),
                size: meta.size,
                limit: n,
                why: "larger than its manifest entry lists: corrupt or replaced; not merged".into(),
                saving: false,
            });
        }
        n => n,
    };
    if size < (FOOTER_SIZE as u64) + 4 {
        return Err(corrupt(
            f,
            format!("{size} bytes cannot hold a Parquet file"),
        ));
    }
    let tail_start = size.saturating_sub(TAIL_BYTES);
    let read = |offset: u64, len: u64| async move {
        store
            .get_range(&f.path, offset, len)
            .await
            .map_err(Error::storage("read compaction source", f.path.clone()))
    };
    let mut tail = read(tail_start, size - tail_start).await?;
    let last: [u8; FOOTER_SIZE] = tail
        .get(tail.len() - FOOTER_SIZE..)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| corrupt(f, "no footer"))?;
    let footer = FooterTail::try_new(&last).map_err(|e| corrupt(f, format!("footer: {e}")))?;
    let needed = u64::try_from(footer.metadata_length()).unwrap_or(u64::MAX);
    let needed = needed.saturating_add(FOOTER_SIZE as u64);
    if needed > size - 4 {
        return Err(corrupt(f, "its footer is longer than the file"));
    }
    let mut tail_start = tail_start;
    if needed > size - tail_start {
        // A footer larger than the first read: read what precedes it too.
        let start = size - needed;
        let head = read(start, tail_start - start).await?;
        let mut joined = Vec::with_capacity(head.len() + tail.len());
        joined.extend_from_slice(&head);
        joined.extend_from_slice(&tail);
        tail = Bytes::from(joined);
        tail_start = start;
    }
    let footer_at = usize::try_from(size - needed - tail_start).unwrap_or(usize::MAX);
    let meta_bytes = tail
        .get(footer_at..tail.len() - FOOTER_SIZE)
        .ok_or_else(|| corrupt(f, "footer outside the file"))?;
    let meta = ParquetMetaDataReader::decode_metadata(meta_bytes)
        .map_err(|e| corrupt(f, format!("unreadable footer: {e}")))?;
    footer::check_metadata(&f.path, meta.file_metadata())?;
    let meta = Arc::new(meta);
    let arrow = ArrowReaderMetadata::try_new(meta.clone(), ArrowReaderOptions::new())
        .map_err(|e| corrupt(f, format!("unreadable schema: {e}")))?;
    // Only a base's chunks are ever copied (a delta's rows always pass through the merge).
    let offsets = (f.tier == Tier::Base)
        .then(|| offset_indexes(&meta, Segment::new(tail_start, tail.clone(), size)))
        .flatten();
    Ok(Source {
        entry: f.clone(),
        size,
        tail_start,
        tail,
        meta,
        arrow,
        offsets,
    })
}

/// The offset indexes of a file's column chunks, when `tail` holds every one of them (lakecdc
/// writes them just before the footer); `None` otherwise: the file's chunks are then never
/// copied as they are.
fn offset_indexes(meta: &ParquetMetaData, tail: Segment) -> Option<ParquetOffsetIndex> {
    let mut reader = ParquetMetaDataReader::new_with_metadata(meta.clone())
        .with_offset_index_policy(PageIndexPolicy::Required)
        .with_column_index_policy(PageIndexPolicy::Skip);
    reader.read_page_indexes(&tail).ok()?;
    let offsets = reader.finish().ok()?.offset_index()?.clone();
    let whole = offsets.len() == meta.num_row_groups()
        && offsets
            .iter()
            .zip(meta.row_groups())
            .all(|(o, rg)| o.len() == rg.num_columns());
    whole.then_some(offsets)
}

impl Source {
    /// The byte span `[start, end)` of row group `rg`, checked against the file.
    fn span(&self, rg: usize, columns: Option<&[usize]>) -> Result<(u64, u64)> {
        let group = self.meta.row_group(rg);
        let mut span: Option<(u64, u64)> = None;
        for (i, c) in group.columns().iter().enumerate() {
            if columns.is_some_and(|keep| !keep.contains(&i)) {
                continue;
            }
            let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
            let (Ok(start), Ok(len)) = (u64::try_from(start), u64::try_from(c.compressed_size()))
            else {
                return Err(corrupt(&self.entry, "a column chunk has a negative offset"));
            };
            let end = start.saturating_add(len);
            span = Some(match span {
                None => (start, end),
                Some((s, e)) => (s.min(start), e.max(end)),
            });
        }
        match span {
            Some((s, e)) if s >= 4 && e <= self.size => Ok((s, e)),
            Some(_) => Err(corrupt(&self.entry, "a column chunk lies outside the file")),
            None => Ok((4, 4)),
        }
    }

    /// Bytes `[start, end)`: from the tail already read when it holds them, else one ranged
    /// read.
    async fn fetch(&self, store: &dyn ObjectStore, start: u64, end: u64) -> Result<Bytes> {
        if start >= self.tail_start {
            let from = usize::try_from(start - self.tail_start).unwrap_or(usize::MAX);
            let to = usize::try_from(end - self.tail_start).unwrap_or(usize::MAX);
            return self
                .tail
                .get(from..to)
                .map(|s| self.tail.slice_ref(s))
                .ok_or_else(|| corrupt(&self.entry, "a read outside the file"));
        }
        store
            .get_range(&self.entry.path, start, end - start)
            .await
            .map_err(Error::storage(
                "read compaction source",
                self.entry.path.clone(),
            ))
    }

    /// Decodes one row group held in `data` into batches (of `columns` only, when given).
    pub(crate) fn decode(
        &self,
        rg: usize,
        data: Segment,
        columns: Option<&[usize]>,
    ) -> Result<ParquetRecordBatchReader> {
        let mut b = ParquetRecordBatchReaderBuilder::new_with_metadata(data, self.arrow.clone())
            .with_row_groups(vec![rg])
            .with_batch_size(BATCH_ROWS);
        if let Some(keep) = columns {
            let mask =
                ProjectionMask::roots(self.meta.file_metadata().schema_descr(), keep.to_vec());
            b = b.with_projection(mask);
        }
        b.build()
            .map_err(|e| corrupt(&self.entry, format!("row group {rg}: {e}")))
    }

    /// The index of the top-level column `name`.
    pub(crate) fn root(&self, name: &str) -> Option<usize> {
        self.arrow
            .schema()
            .fields()
            .iter()
            .position(|f| f.name() == name)
    }

    /// The root and leaf indexes of the flat top-level columns `names`, in that order (a
    /// missing one is an error naming it).
    pub(crate) fn flat_columns(&self, names: &[&str]) -> Result<(Vec<usize>, Vec<usize>)> {
        let leaves = self.meta.file_metadata().schema_descr();
        let mut roots = Vec::with_capacity(names.len());
        let mut leaf = Vec::with_capacity(names.len());
        for name in names {
            let missing = || corrupt(&self.entry, format!("column {name} is missing"));
            roots.push(self.root(name).ok_or_else(missing)?);
            leaf.push(
                leaves
                    .columns()
                    .iter()
                    .position(|c| c.path().parts() == [*name])
                    .ok_or_else(missing)?,
            );
        }
        Ok((roots, leaf))
    }

    /// Row group `rg` decoded, of the columns `roots` (with their leaves `leaves`) only, or of
    /// every column (`None`): one ranged read of the span they occupy, decoded on a blocking
    /// thread. Nothing is verified (the checksum covers whole files).
    pub(crate) async fn read_group(
        self: &Arc<Self>,
        store: &dyn ObjectStore,
        rg: usize,
        columns: Option<(&[usize], &[usize])>,
    ) -> Result<Vec<RecordBatch>> {
        let (start, end) = self.span(rg, columns.map(|(_, leaves)| leaves))?;
        let bytes = self.fetch(store, start, end).await?;
        let data = Segment::new(start, bytes, self.size);
        let me = self.clone();
        let roots = columns.map(|(roots, _)| roots.to_vec());
        tokio::task::spawn_blocking(move || -> Result<Vec<RecordBatch>> {
            me.decode(rg, data, roots.as_deref())?
                .map(|b| b.map_err(|e| corrupt(&me.entry, format!("row group {rg}: {e}"))))
                .collect()
        })
        .await
        .map_err(Error::task("decode a row group"))?
    }

    /// Reads the `row_id` column of every row group (for the plan: nothing is verified, and
    /// no other column is read), handing each decoded batch to `each`.
    pub(crate) async fn row_ids(
        self: &Arc<Self>,
        store: &dyn ObjectStore,
        mut each: impl FnMut(&RecordBatch) -> Result<()>,
    ) -> Result<()> {
        let (roots, leaves) = self.flat_columns(&["row_id"])?;
        for rg in 0..self.meta.num_row_groups() {
            for b in &self.read_group(store, rg, Some((&roots, &leaves))).await? {
                each(b)?;
            }
        }
        Ok(())
    }
}

/// Bytes of a file starting at `offset`: a [`ChunkReader`] that serves reads inside them only.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    offset: u64,
    bytes: Bytes,
    file_len: u64,
}

impl Segment {
    fn new(offset: u64, bytes: Bytes, file_len: u64) -> Self {
        Self {
            offset,
            bytes,
            file_len,
        }
    }

    fn slice(&self, start: u64, len: u64) -> parquet::errors::Result<Bytes> {
        let outside = || {
            ParquetError::General(format!(
                "read of {len} bytes at {start} outside the fetched bytes {}..{}",
                self.offset,
                self.offset + self.bytes.len() as u64
            ))
        };
        let from = start.checked_sub(self.offset).ok_or_else(outside)?;
        let from = usize::try_from(from).map_err(|_| outside())?;
        let to = from
            .checked_add(usize::try_from(len).map_err(|_| outside())?)
            .ok_or_else(outside)?;
        if to > self.bytes.len() {
            return Err(outside());
        }
        Ok(self.bytes.slice(from..to))
    }
}

impl Length for Segment {
    fn len(&self) -> u64 {
        self.file_len
    }
}

impl ChunkReader for Segment {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let end = self.offset + self.bytes.len() as u64;
        Ok(self.slice(start, end.saturating_sub(start))?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, length as u64)
    }
}

/// One row group of a source as the merge met it: the bytes its column chunks lie in, so that
/// a rewrite that leaves a column of it unchanged copies that column's chunk into the new file
/// as it is, instead of encoding and compressing it again (docs/design.md §9).
#[derive(Debug)]
pub(crate) struct Group {
    /// The file.
    pub source: Arc<Source>,
    /// The row group's index in it.
    pub rg: usize,
    /// Bytes of the file holding every column chunk of the row group.
    pub data: Segment,
}

/// What a source stream hands the merge.
#[derive(Debug)]
pub(crate) enum Piece {
    /// Row group `rg` of the stream's file `file`.
    RowGroup {
        /// The file's position in the stream.
        file: usize,
        /// The file, opened by the stream when it reached it.
        source: Arc<Source>,
        /// The row group.
        rg: usize,
        /// Its bytes.
        data: Segment,
    },
    /// File `file` was read to its end and hashed to its manifest checksum.
    Verified {
        /// The file's position in the stream.
        file: usize,
    },
}

/// A file of a stream: opened already, or to be opened when the stream reaches it.
#[derive(Debug)]
pub(crate) enum Opening {
    /// Its footer read and checked.
    Open(Arc<Source>),
    /// Opened (its size and footer checked, as [`open`] does) when the stream reaches it.
    Later(FileEntry),
}

/// Reads the files of one stream in order, each opened by then or while the file before it
/// streams (one footer ahead), and dropped once read, row group by row group,
/// into `tx` (which holds at most its capacity of row groups), hashing every byte; a file is
/// [`Piece::Verified`] once its hash matches the manifest's (or the check is skipped). Ends
/// quietly when the merge hangs up.
pub(crate) async fn pump(
    store: Arc<dyn ObjectStore>,
    files: Vec<Opening>,
    skip_verify: bool,
    tx: mpsc::Sender<Result<Piece>>,
) {
    // The next file's footer is read while this one streams (one footer ahead).
    let ahead = |opening: Opening| {
        let store = store.clone();
        tokio::spawn(async move {
            match opening {
                Opening::Open(src) => Ok(src),
                Opening::Later(entry) => open(store.as_ref(), &entry).await.map(Arc::new),
            }
        })
    };
    let mut files = files.into_iter();
    let mut next = files.next().map(ahead);
    let mut file = 0;
    while let Some(opening) = next.take() {
        let src = match opening.await {
            Ok(src) => src,
            Err(e) => Err(Error::task("open a compaction source")(e)),
        };
        next = files.next().map(ahead);
        let res = match src {
            Ok(src) => pump_file(store.as_ref(), file, src, skip_verify, &tx).await,
            Err(e) => Err(e),
        };
        match res {
            Ok(true) => file += 1,
            Ok(false) => return,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}

/// One file of [`pump`]; `Ok(false)` when the merge hung up.
async fn pump_file(
    store: &dyn ObjectStore,
    file: usize,
    src: Arc<Source>,
    skip_verify: bool,
    tx: &mpsc::Sender<Result<Piece>>,
) -> Result<bool> {
    let mut hasher = Sha256::new();
    let mut pos = 0u64;
    for rg in 0..src.meta.num_row_groups() {
        let (start, end) = src.span(rg, None)?;
        if start < pos {
            return Err(corrupt(&src.entry, "its row groups overlap"));
        }
        let bytes = src.fetch(store, pos, end).await?;
        hasher.update(&bytes);
        let data = Segment::new(pos, bytes, src.size);
        pos = end;
        let source = src.clone();
        if tx
            .send(Ok(Piece::RowGroup {
                file,
                source,
                rg,
                data,
            }))
            .await
            .is_err()
        {
            return Ok(false);
        }
    }
    if pos < src.size {
        let rest = src.fetch(store, pos, src.size).await?;
        hasher.update(&rest);
    }
    let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
    match &src.entry.checksum {
        Some(want) if *want != actual && !skip_verify => {
            return Err(corrupt(
                &src.entry,
                format!(
                    "checksum mismatch (manifest {want}, object {actual}): the object is corrupt; refusing to merge it (--skip-input-checksum-verify overrides)"
                ),
            ));
        }
        Some(want) if *want != actual => {
            tracing::warn!(path = %src.entry.path, "checksum mismatch ignored (--skip-input-checksum-verify)");
        }
        None => tracing::warn!(path = %src.entry.path, "source has no checksum; merged unverified"),
        Some(_) => {}
    }
    Ok(tx.send(Ok(Piece::Verified { file })).await.is_ok())
}

/// The merge's side of one stream: decoded batches of its files in order, and the end only
/// once every file was verified.
pub(crate) struct Cursor {
    rx: mpsc::Receiver<Result<Piece>>,
    /// How many files the stream reads.
    files: usize,
    /// The row group being decoded and how many of its rows were handed out.
    reader: Option<(Arc<Group>, ParquetRecordBatchReader, usize)>,
    verified: usize,
}

/// A decoded batch and where its rows lie: rows `offset..` of `group`.
pub(crate) struct Decoded {
    pub group: Arc<Group>,
    pub offset: usize,
    pub batch: RecordBatch,
}

impl Cursor {
    /// A cursor over the pieces [`pump`] sends for a stream of `files` files.
    pub(crate) fn new(rx: mpsc::Receiver<Result<Piece>>, files: usize) -> Self {
        Self {
            rx,
            files,
            reader: None,
            verified: 0,
        }
    }

    /// The next batch and where it came from; `None` once every file was read and
    /// verified. Blocks (call it on a blocking thread).
    pub(crate) fn next_batch(&mut self) -> Result<Option<Decoded>> {
        loop {
            if let Some((group, reader, done)) = &mut self.reader {
                match reader.next() {
                    Some(Ok(batch)) => {
                        let offset = *done;
                        *done += batch.num_rows();
                        return Ok(Some(Decoded {
                            group: group.clone(),
                            offset,
                            batch,
                        }));
                    }
                    Some(Err(e)) => {
                        return Err(corrupt(&group.source.entry, format!("decode: {e}")));
                    }
                    None => self.reader = None,
                }
            }
            match self.rx.blocking_recv() {
                None if self.verified == self.files => return Ok(None),
                None => {
                    return Err(Error::Invariant(
                        "a compaction source stream ended before its files were verified".into(),
                    ));
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(Piece::Verified { file })) if file == self.verified => self.verified += 1,
                Some(Ok(Piece::Verified { .. })) => {
                    return Err(Error::Invariant(
                        "a compaction source was verified out of order".into(),
                    ));
                }
                Some(Ok(Piece::RowGroup {
                    file,
                    source,
                    rg,
                    data,
                })) => {
                    if file >= self.files || file < self.verified {
                        return Err(Error::Invariant("a row group of no source".into()));
                    }
                    let reader = source.decode(rg, data.clone(), None)?;
                    self.reader = Some((Arc::new(Group { source, rg, data }), reader, 0));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_serves_reads_inside_its_bytes_only() {
        let s = Segment::new(10, Bytes::from_static(b"abcdef"), 100);
        assert_eq!(s.len(), 100);
        assert_eq!(&s.get_bytes(11, 3).unwrap()[..], b"bcd");
        assert_eq!(&s.get_bytes(10, 6).unwrap()[..], b"abcdef");
        assert!(s.get_bytes(9, 1).is_err());
        assert!(s.get_bytes(15, 2).is_err());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut s.get_read(13).unwrap(), &mut rest).unwrap();
        assert_eq!(rest, "def");
    }
}
