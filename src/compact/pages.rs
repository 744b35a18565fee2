//! Runs of a base row group's pages, repeated in a new base as they are (docs/design.md §9).
//!
//! A base row group too large to fit whole in a new base (a base written at its target, whose
//! changed columns grow it past it) is cut at the page starts of its `row_id` column into
//! runs that do fit; each run is written as a row group of its own, its unchanged columns
//! copied page by page (the column's dictionary page and the run's data pages, as they are)
//! and only its changed columns encoded. A column whose pages do not start where the run does
//! (a dictionary that fell back to plain pages mid-chunk starts new pages there) keeps the plain
//! pages wholly inside the run: they are copied, the rows before and after them encoded as
//! pages of their own without a dictionary. A copied run's chunk metadata is made anew: its
//! values, sizes and offsets from the page headers and the offset index, its statistics from
//! the rows themselves, exactly as encoding them would make them.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{ArrowNumericType, DataType, Field, Int16Type, Int32Type, Int64Type};
use bytes::{Bytes, BytesMut};
use parquet::basic::EncodingMask;
use parquet::column::writer::ColumnCloseResult;
use parquet::data_type::{ByteArray, FixedLenByteArray};
use parquet::file::metadata::{ColumnChunkMetaData, LevelHistogram};
use parquet::file::page_index::offset_index::{OffsetIndexMetaData, PageLocation};
use parquet::file::reader::ChunkReader;
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescriptor;

use crate::engine::parallel::{Earlier, plain_chunk};
use crate::lake::streamed::Group;

/// The longest min or max of a text column that statistics hold untruncated (the parquet
/// writer's default): longer bounds are cut as the writer cuts them.
const STATISTICS_TRUNCATE_LENGTH: usize = 64;

/// Column `field`'s chunk in `group` when it is stored exactly as a new file stores it
/// (`descr`), with its offset index: the leaf, its metadata and its pages.
pub(crate) fn located<'a>(
    group: &'a Group,
    field: &Field,
    descr: &ColumnDescriptor,
) -> Option<(&'a ColumnChunkMetaData, &'a OffsetIndexMetaData)> {
    let src = &group.source;
    let name = field.name();
    let root = src.root(name)?;
    if src.arrow.schema().field(root).data_type() != field.data_type() {
        return None;
    }
    let (leaf, offsets) = leaf_pages(group, name)?;
    let meta = src.meta.row_group(group.rg).columns().get(leaf)?;
    if meta.column_descr() != descr
        || !matches!(meta.compression(), parquet::basic::Compression::ZSTD(_))
    {
        return None;
    }
    // A merge reads a NULL `deleted_at` as 0 (see `merge::conform`): such a chunk differs
    // from the rows it stands for.
    if name == "deleted_at" && meta.statistics().and_then(|s| s.null_count_opt()) != Some(0) {
        return None;
    }
    Some((meta, offsets))
}

/// Column `name`'s leaf in `group`'s file (every lake column has one) and its pages in the row
/// group.
fn leaf_pages<'a>(group: &'a Group, name: &str) -> Option<(usize, &'a OffsetIndexMetaData)> {
    let src = &group.source;
    let leaf = src
        .meta
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.path().parts().first().map(String::as_str) == Some(name))?;
    let pages = src.offsets.as_ref()?.get(group.rg)?.get(leaf)?;
    Some((leaf, pages))
}

/// Rows `first..first + rows` of a base row group, cut at page starts of its `row_id` column.
pub(crate) struct Run {
    group: Arc<Group>,
    first: usize,
    rows: usize,
    /// Its share of the row group's compressed bytes, dictionary pages counted whole.
    bytes: u64,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("first", &self.first)
            .field("rows", &self.rows)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// The compressed bytes rows `a..b` of `group` take: per column, the share of each data page
/// they overlap, and the dictionary page whole (every run repeats it).
fn run_bytes(group: &Group, a: usize, b: usize) -> u64 {
    let Some(offsets) = group.source.offsets.as_ref().and_then(|o| o.get(group.rg)) else {
        return 0;
    };
    let meta = group.source.meta.row_group(group.rg);
    let rows = group.rows();
    let mut total = 0u128;
    for (chunk, index) in meta.columns().iter().zip(offsets) {
        let pages = &index.page_locations;
        if let (Some(dict), Some(p)) = (chunk.dictionary_page_offset(), pages.first()) {
            total += u128::try_from(p.offset.saturating_sub(dict)).unwrap_or(0);
        }
        for (i, p) in pages.iter().enumerate() {
            let start = usize::try_from(p.first_row_index).unwrap_or(0);
            let end = pages
                .get(i + 1)
                .map_or(rows, |n| usize::try_from(n.first_row_index).unwrap_or(rows));
            let overlap = end.min(b).saturating_sub(start.max(a));
            if overlap > 0 && end > start {
                let size = u128::try_from(p.compressed_page_size).unwrap_or(0);
                total += size * overlap as u128 / (end - start) as u128;
            }
        }
    }
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// Cuts `group` into runs at page starts of its `row_id` column, each of at most `first`
/// compressed bytes for the first run (`rest` when its first page alone passes `first`: the
/// file is cut before it) and `rest` for the others, a run holding at least one page. None
/// when the row group has no such page start inside.
pub(crate) fn runs(group: &Arc<Group>, first: u64, rest: u64) -> Vec<Arc<dyn Earlier>> {
    let rows = group.rows();
    let Some((_, index)) = leaf_pages(group, "row_id") else {
        return Vec::new();
    };
    let mut starts: Vec<usize> = index
        .page_locations
        .iter()
        .filter_map(|p| usize::try_from(p.first_row_index).ok())
        .filter(|&r| r > 0 && r < rows)
        .collect();
    starts.push(rows);
    if starts.len() < 2 {
        return Vec::new();
    }
    let mut out: Vec<Arc<dyn Earlier>> = Vec::new();
    let mut a = 0;
    let mut max = if run_bytes(group, 0, starts[0]) <= first {
        first
    } else {
        rest
    };
    let mut i = 0;
    while a < rows {
        // At least one page; then pages while the run stays within `max`.
        let mut b = starts[i];
        i += 1;
        while i < starts.len() && run_bytes(group, a, starts[i]) <= max {
            b = starts[i];
            i += 1;
        }
        out.push(Arc::new(Run {
            group: group.clone(),
            first: a,
            rows: b - a,
            bytes: run_bytes(group, a, b),
        }));
        a = b;
        max = rest;
    }
    if out.len() < 2 { Vec::new() } else { out }
}

impl Earlier for Run {
    fn rows(&self) -> usize {
        self.rows
    }

    fn compressed_bytes(&self) -> u64 {
        self.bytes
    }

    fn copyable(&self) -> bool {
        self.group.copyable()
    }

    fn chunk(
        &self,
        field: &Field,
        descr: &ColumnDescriptor,
        values: &[ArrayRef],
    ) -> Option<(ColumnCloseResult, Bytes)> {
        if descr.max_rep_level() != 0 || descr.max_def_level() > 1 {
            return None;
        }
        if values.iter().map(|v| v.len()).sum::<usize>() != self.rows {
            return None;
        }
        let (meta, index) = located(&self.group, field, descr)?;
        let pages = &index.page_locations;
        let rows = self.group.rows();
        let start = |k: usize| {
            pages
                .get(k)
                .map_or(Some(rows), |p| usize::try_from(p.first_row_index).ok())
        };
        let end = self.first + self.rows;
        // The pages wholly inside the run: `i..j`.
        let i = (0..pages.len()).find(|&k| start(k).is_some_and(|r| r >= self.first))?;
        let mut j = i;
        while j < pages.len() && start(j + 1)? <= end {
            j += 1;
        }
        if j <= i {
            return None;
        }
        let nulls: usize = values.iter().map(|v| v.null_count()).sum();
        let mut out = Copied::new();
        if start(i)? == self.first && start(j)? == end {
            // Lined up: the dictionary page (if any) and the run's pages.
            if let Some(d) = meta.dictionary_page_offset() {
                let len = pages.first()?.offset.checked_sub(d)?;
                out.page(&self.group.data, d, len)?;
                out.dictionary = true;
            }
            out.pages(&self.group.data, index, i..j, self.first)?;
        } else {
            // Not lined up: the run's plain pages (those after the dictionary fell back) copied,
            // the rows before and after them encoded without a dictionary.
            let data = &self.group.data;
            let mut k = j;
            while k > i && !page_at(data, pages.get(k - 1)?.offset)?.needs_dictionary() {
                k -= 1;
            }
            if k == j {
                return None;
            }
            let (a, b) = (start(k)? - self.first, start(j)? - self.first);
            if a > 0 {
                out.encoded(field, &slice(values, 0, a), 0)?;
            }
            out.pages(data, index, k..j, self.first)?;
            if b < self.rows {
                out.encoded(field, &slice(values, b, self.rows), b)?;
            }
        }
        let encodings = if out.encoded {
            // Those of the pages encoded here and of the pages copied.
            EncodingMask::try_new(out.encodings).ok()?
        } else {
            *meta.encodings_mask()
        };
        let Copied {
            bytes,
            uncompressed,
            dictionary,
            locations,
            unencoded,
            ..
        } = out;
        let unencoded_pages = match meta.unencoded_byte_array_data_bytes() {
            Some(_) => Some(unencoded?),
            None => None,
        };
        let unencoded = unencoded_pages.as_ref().map(|u| u.iter().sum::<i64>());
        let definitions = match meta.definition_level_histogram() {
            Some(_) if descr.max_def_level() == 1 => Some(LevelHistogram::from(vec![
                i64::try_from(nulls).ok()?,
                i64::try_from(self.rows - nulls).ok()?,
            ])),
            Some(_) => return None,
            None => None,
        };
        if meta.repetition_level_histogram().is_some() {
            return None;
        }
        let len = bytes.len();
        let first_data = if dictionary {
            locations.first()?.offset
        } else {
            0
        };
        let mut builder = ColumnChunkMetaData::builder(meta.column_descr_ptr())
            .set_compression(meta.compression())
            .set_encodings_mask(encodings)
            .set_total_compressed_size(i64::try_from(len).ok()?)
            .set_total_uncompressed_size(uncompressed)
            .set_num_values(i64::try_from(self.rows).ok()?)
            .set_data_page_offset(first_data)
            .set_dictionary_page_offset(dictionary.then_some(0))
            .set_unencoded_byte_array_data_bytes(unencoded)
            .set_definition_level_histogram(definitions);
        if meta.statistics().is_some() {
            builder = builder.set_statistics(statistics(field, descr, values, nulls)?);
        }
        let close = ColumnCloseResult {
            bytes_written: len as u64,
            rows_written: u64::try_from(self.rows).ok()?,
            metadata: builder.build().ok()?,
            bloom_filter: None,
            column_index: None,
            offset_index: Some(OffsetIndexMetaData {
                page_locations: locations,
                unencoded_byte_array_data_bytes: unencoded_pages,
            }),
        };
        Some((close, bytes.freeze()))
    }
}

/// A run's chunk as it is put together: its bytes, its uncompressed size as the chunk metadata
/// counts it, its pages (offsets relative to its bytes, rows to the run's first) and their
/// unencoded byte counts (none once a part lacks them).
struct Copied {
    bytes: BytesMut,
    uncompressed: i64,
    /// Whether it starts with the earlier chunk's dictionary page.
    dictionary: bool,
    locations: Vec<PageLocation>,
    unencoded: Option<Vec<i64>>,
    /// Whether some of its pages were encoded here.
    encoded: bool,
    /// The encodings of its data pages (and, for pages encoded here, of their levels), as an
    /// [`EncodingMask`]'s bits.
    encodings: i32,
}

impl Copied {
    fn new() -> Self {
        Self {
            bytes: BytesMut::new(),
            uncompressed: 0,
            dictionary: false,
            locations: Vec::new(),
            unencoded: Some(Vec::new()),
            encoded: false,
            encodings: 0,
        }
    }

    /// Appends the page of `len` bytes (its header included) at `offset` of `data`.
    fn page<R: ChunkReader>(&mut self, data: &R, offset: i64, len: i64) -> Option<Header> {
        let raw = data
            .get_bytes(u64::try_from(offset).ok()?, usize::try_from(len).ok()?)
            .ok()?;
        let header = page_header(&raw)?;
        let header_len = i64::try_from(header.len).ok()?;
        // The offset index's page size counts the header: the two must agree.
        if header_len + i64::from(header.compressed) != len {
            return None;
        }
        self.uncompressed += header_len + i64::from(header.uncompressed);
        self.bytes.extend_from_slice(&raw);
        Some(header)
    }

    /// Appends data pages `range` of the earlier chunk whose pages `index` lists, for a run
    /// starting at its row `first`.
    fn pages<R: ChunkReader>(
        &mut self,
        data: &R,
        index: &OffsetIndexMetaData,
        range: std::ops::Range<usize>,
        first: usize,
    ) -> Option<()> {
        let first = i64::try_from(first).ok()?;
        for k in range {
            let p = index.page_locations.get(k)?;
            let mut moved = p.clone();
            moved.offset = i64::try_from(self.bytes.len()).ok()?;
            moved.first_row_index = p.first_row_index.checked_sub(first)?;
            let header = self.page(data, p.offset, i64::from(p.compressed_page_size))?;
            if let Some(e) = header.encoding {
                self.encodings |= 1i32.checked_shl(u32::try_from(e).ok()?)?;
            }
            self.locations.push(moved);
            let bytes = index
                .unencoded_byte_array_data_bytes
                .as_ref()
                .and_then(|u| u.get(k).copied());
            match (&mut self.unencoded, bytes) {
                (Some(u), Some(b)) => u.push(b),
                (u, _) => *u = None,
            }
        }
        Some(())
    }

    /// Appends `values` of column `field`, rows `at..` of the run, encoded as pages of their
    /// own without a dictionary.
    fn encoded(&mut self, field: &Field, values: &[ArrayRef], at: usize) -> Option<()> {
        let (close, bytes) = plain_chunk(field, values)?;
        if close.metadata.dictionary_page_offset().is_some() {
            return None;
        }
        let base = i64::try_from(self.bytes.len()).ok()?;
        let at = i64::try_from(at).ok()?;
        let index = close.offset_index?;
        for p in index.page_locations {
            let mut moved = p;
            moved.offset = moved.offset.checked_add(base)?;
            moved.first_row_index = moved.first_row_index.checked_add(at)?;
            self.locations.push(moved);
        }
        match (&mut self.unencoded, index.unencoded_byte_array_data_bytes) {
            (Some(u), Some(b)) => u.extend(b),
            (u, _) => *u = None,
        }
        self.uncompressed += close.metadata.uncompressed_size();
        self.encodings |= close.metadata.encodings_mask().as_i32();
        self.encoded = true;
        self.bytes.extend_from_slice(&bytes);
        Some(())
    }
}

/// The page header at `offset` of `data`.
fn page_at<R: ChunkReader>(data: &R, offset: i64) -> Option<Header> {
    // A header is at most a few hundred bytes (no page statistics in lake files).
    let len = usize::try_from(data.len().checked_sub(u64::try_from(offset).ok()?)?)
        .ok()?
        .min(4096);
    page_header(&data.get_bytes(u64::try_from(offset).ok()?, len).ok()?)
}

/// Rows `a..b` of a column held in parts.
fn slice(parts: &[ArrayRef], a: usize, b: usize) -> Vec<ArrayRef> {
    let mut out = Vec::new();
    let mut at = 0;
    for part in parts {
        let (lo, hi) = (a.max(at), b.min(at + part.len()));
        if lo < hi {
            out.push(part.slice(lo - at, hi - lo));
        }
        at += part.len();
    }
    out
}

/// The chunk statistics the parquet writer makes of `values` (a flat column of type `field`,
/// `nulls` of them null): min and max by the column's sort order (text bounds cut as the
/// writer cuts them), the null count. None for a type this does not know.
fn statistics(
    field: &Field,
    descr: &ColumnDescriptor,
    values: &[ArrayRef],
    nulls: usize,
) -> Option<Statistics> {
    let nulls = Some(u64::try_from(nulls).ok()?);
    let signed = descr.sort_order().is_signed();
    Some(match field.data_type() {
        DataType::Int64 => {
            let (lo, hi) = primitive::<Int64Type>(values)?;
            Statistics::Int64(plain(lo, hi, nulls, signed))
        }
        DataType::Int32 => {
            let (lo, hi) = primitive::<Int32Type>(values)?;
            Statistics::Int32(plain(lo, hi, nulls, signed))
        }
        DataType::Int16 => {
            let (lo, hi) = primitive::<Int16Type>(values)?;
            Statistics::Int32(plain(lo.map(i32::from), hi.map(i32::from), nulls, signed))
        }
        DataType::Boolean => {
            let parts = values.iter().map(|v| {
                let a = v.as_boolean_opt()?;
                Some((
                    arrow::compute::min_boolean(a),
                    arrow::compute::max_boolean(a),
                ))
            });
            let (lo, hi) = fold(parts.collect::<Option<Vec<_>>>()?)?;
            Statistics::Boolean(plain(lo, hi, nulls, signed))
        }
        DataType::FixedSizeBinary(_) => {
            let parts = values.iter().map(|v| {
                let a = v.as_fixed_size_binary_opt()?;
                Some((
                    arrow::compute::min_fixed_size_binary(a).map(<[u8]>::to_vec),
                    arrow::compute::max_fixed_size_binary(a).map(<[u8]>::to_vec),
                ))
            });
            let (lo, hi) = fold(parts.collect::<Option<Vec<_>>>()?)?;
            let flba = |b: Vec<u8>| FixedLenByteArray::from(ByteArray::from(b));
            Statistics::FixedLenByteArray(bytes(lo.map(flba), hi.map(flba), nulls, signed))
        }
        DataType::Utf8 => {
            let parts = values.iter().map(|v| {
                let a = v.as_string_opt::<i32>()?;
                Some((
                    arrow::compute::min_string(a).map(str::to_owned),
                    arrow::compute::max_string(a).map(str::to_owned),
                ))
            });
            let (lo, hi) = fold(parts.collect::<Option<Vec<_>>>()?)?;
            let (Some(lo), Some(hi)) = (lo, hi) else {
                return Some(Statistics::ByteArray(plain(None, None, nulls, signed)));
            };
            let (min, min_exact) = truncated_min(&lo);
            let (max, max_exact) = truncated_max(&hi);
            Statistics::ByteArray(
                ValueStatistics::new(
                    Some(ByteArray::from(min)),
                    Some(ByteArray::from(max)),
                    None,
                    nulls,
                    signed,
                )
                .with_max_is_exact(max_exact)
                .with_min_is_exact(min_exact),
            )
        }
        _ => return None,
    })
}

/// A text column's smallest value as the writer's statistics hold it: cut to the longest
/// prefix of at most [`STATISTICS_TRUNCATE_LENGTH`] bytes that ends on a character boundary
/// (then not exact), or whole.
fn truncated_min(s: &str) -> (Vec<u8>, bool) {
    if s.len() <= STATISTICS_TRUNCATE_LENGTH {
        return (s.as_bytes().to_vec(), true);
    }
    match (1..=STATISTICS_TRUNCATE_LENGTH).rfind(|&x| s.is_char_boundary(x)) {
        Some(at) => (s.as_bytes()[..at].to_vec(), false),
        None => (s.as_bytes().to_vec(), true),
    }
}

/// A text column's largest value as the writer's statistics hold it: cut at the last
/// character boundary within the truncation length's last four bytes, its last character that
/// can be raised without growing its byte length raised (then not exact); whole when there is
/// no such character.
fn truncated_max(s: &str) -> (Vec<u8>, bool) {
    if s.len() <= STATISTICS_TRUNCATE_LENGTH {
        return (s.as_bytes().to_vec(), true);
    }
    let low = STATISTICS_TRUNCATE_LENGTH.saturating_sub(3);
    let raised = (low..=STATISTICS_TRUNCATE_LENGTH)
        .rfind(|&x| s.is_char_boundary(x))
        .and_then(|at| s.get(..at))
        .and_then(|head| {
            head.char_indices().rev().find_map(|(i, c)| {
                let next = char::from_u32(u32::from(c) + 1)?;
                (next.len_utf8() == c.len_utf8()).then(|| {
                    let mut out = head.as_bytes()[..i].to_vec();
                    out.extend_from_slice(next.encode_utf8(&mut [0; 4]).as_bytes());
                    out
                })
            })
        });
    match raised {
        Some(out) => (out, false),
        None => (s.as_bytes().to_vec(), true),
    }
}

/// A column's smallest and largest value (none when every value is null).
type Bounds<T> = (Option<T>, Option<T>);

/// The smallest and the largest of the parts' bounds.
fn fold<T: PartialOrd>(parts: Vec<Bounds<T>>) -> Option<Bounds<T>> {
    let (mut lo, mut hi): Bounds<T> = (None, None);
    for (a, b) in parts {
        if let Some(a) = a
            && lo.as_ref().is_none_or(|l| a < *l)
        {
            lo = Some(a);
        }
        if let Some(b) = b
            && hi.as_ref().is_none_or(|h| b > *h)
        {
            hi = Some(b);
        }
    }
    Some((lo, hi))
}

/// The bounds of a numeric column's parts; None when a part is of another type.
fn primitive<A: ArrowNumericType>(values: &[ArrayRef]) -> Option<Bounds<A::Native>> {
    let parts = values.iter().map(|v| {
        let a = v.as_primitive_opt::<A>()?;
        Some((arrow::compute::min(a), arrow::compute::max(a)))
    });
    fold(parts.collect::<Option<Vec<_>>>()?)
}

/// Statistics as the parquet writer makes them for a type other than byte arrays, or for a
/// byte-array column whose values are all null.
fn plain<T>(lo: Option<T>, hi: Option<T>, nulls: Option<u64>, signed: bool) -> ValueStatistics<T> {
    ValueStatistics::new(lo, hi, None, nulls, false).with_backwards_compatible_min_max(signed)
}

/// Statistics of a byte-array column as the parquet writer makes them: with bounds, marked
/// exact (none was truncated); without (every value null), as any other type's.
fn bytes<T>(lo: Option<T>, hi: Option<T>, nulls: Option<u64>, signed: bool) -> ValueStatistics<T> {
    if lo.is_some() && hi.is_some() {
        ValueStatistics::new(lo, hi, None, nulls, signed)
            .with_max_is_exact(true)
            .with_min_is_exact(true)
    } else {
        plain(lo, hi, nulls, signed)
    }
}

/// What a page header says: its own length in bytes, the page's sizes, and for a data page
/// its values' encoding.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    len: usize,
    uncompressed: i32,
    compressed: i32,
    encoding: Option<i32>,
}

impl Header {
    /// Whether it is a data page whose values need the chunk's dictionary (`PLAIN_DICTIONARY`
    /// or `RLE_DICTIONARY`); a dictionary page, or a header without an encoding, counts as
    /// needing it.
    fn needs_dictionary(&self) -> bool {
        !matches!(self.encoding, Some(e) if e != 2 && e != 8)
    }
}

/// Reads the page header (a Thrift compact-protocol `PageHeader`) at the start of `bytes`:
/// fields 2 and 3 are the page's uncompressed and compressed sizes, the encoding is field 2 of
/// a version 1 data page's header (field 5) and field 4 of a version 2 one's (field 8); every
/// other field is skipped. None for anything malformed.
fn page_header(bytes: &[u8]) -> Option<Header> {
    let mut r = Reader { bytes, at: 0 };
    let (mut uncompressed, mut compressed, mut encoding) = (None, None, None);
    let mut id: i16 = 0;
    while let Some((field, kind)) = r.field(&mut id)? {
        match (field, kind) {
            (2, 5) => uncompressed = Some(i32::try_from(zigzag(r.varint()?)).ok()?),
            (3, 5) => compressed = Some(i32::try_from(zigzag(r.varint()?)).ok()?),
            (5, 12) => encoding = r.struct_i32(2)?,
            (8, 12) => encoding = r.struct_i32(4)?,
            _ => r.skip(kind, 0)?,
        }
    }
    Some(Header {
        len: r.at,
        uncompressed: uncompressed.filter(|&u| u >= 0)?,
        compressed: compressed.filter(|&c| c >= 0)?,
        encoding,
    })
}

fn zigzag(n: u64) -> i64 {
    ((n >> 1) as i64) ^ -((n & 1) as i64)
}

/// A cursor over Thrift compact-protocol bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }

    /// The next field header of a struct whose last field id was `id`: its id and compact
    /// type, or `Some(None)` at the struct's end.
    fn field(&mut self, id: &mut i16) -> Option<Option<(i16, u8)>> {
        let b = self.byte()?;
        if b == 0 {
            return Some(None);
        }
        *id = match b >> 4 {
            0 => i16::try_from(zigzag(self.varint()?)).ok()?,
            delta => id.checked_add(i16::from(delta))?,
        };
        Some(Some((*id, b & 0x0f)))
    }

    /// Reads a struct, returning its i32 field `want` (if present); every field is skipped.
    fn struct_i32(&mut self, want: i16) -> Option<Option<i32>> {
        let mut id: i16 = 0;
        let mut found = None;
        while let Some((field, kind)) = self.field(&mut id)? {
            if field == want && kind == 5 {
                found = Some(i32::try_from(zigzag(self.varint()?)).ok()?);
            } else {
                self.skip(kind, 1)?;
            }
        }
        Some(found)
    }

    fn advance(&mut self, n: usize) -> Option<()> {
        self.at = self.at.checked_add(n).filter(|&e| e <= self.bytes.len())?;
        Some(())
    }

    /// Skips a value of compact type `kind` (a list element's booleans take a byte).
    fn skip(&mut self, kind: u8, depth: usize) -> Option<()> {
        if depth > 16 {
            return None;
        }
        match kind {
            1 | 2 => Some(()),
            3 => self.advance(1),
            4..=6 => self.varint().map(|_| ()),
            7 => self.advance(8),
            8 => {
                let n = usize::try_from(self.varint()?).ok()?;
                self.advance(n)
            }
            9 | 10 => {
                let b = self.byte()?;
                let n = match b >> 4 {
                    15 => usize::try_from(self.varint()?).ok()?,
                    n => usize::from(n),
                };
                let element = b & 0x0f;
                for _ in 0..n {
                    if matches!(element, 1 | 2) {
                        self.advance(1)?;
                    } else {
                        self.skip(element, depth + 1)?;
                    }
                }
                Some(())
            }
            11 => {
                let n = usize::try_from(self.varint()?).ok()?;
                if n > 0 {
                    let b = self.byte()?;
                    for _ in 0..n {
                        for k in [b >> 4, b & 0x0f] {
                            if matches!(k, 1 | 2) {
                                self.advance(1)?;
                            } else {
                                self.skip(k, depth + 1)?;
                            }
                        }
                    }
                }
                Some(())
            }
            12 => loop {
                let b = self.byte()?;
                if b == 0 {
                    return Some(());
                }
                if b >> 4 == 0 {
                    self.varint()?;
                }
                self.skip(b & 0x0f, depth + 1)?;
            },
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        BooleanArray, FixedSizeBinaryArray, Int16Array, Int32Array, Int64Array, RecordBatch,
        StringArray,
    };
    use arrow::datatypes::{Schema, SchemaRef};
    use bytes::Bytes;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::serialized_reader::ReadOptionsBuilder;

    use super::*;
    use crate::engine::parallel::ParallelWriter;
    use crate::schema::batch::uuid_field;

    const ROWS: usize = 50_000;

    /// Rows of every flat lake type, some null, some text long enough that its dictionary
    /// falls back to plain pages.
    fn batch() -> RecordBatch {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            uuid_field("row_id", true),
            Field::new("small", DataType::Int16, true),
            Field::new("int", DataType::Int32, true),
            Field::new("big", DataType::Int64, true),
            Field::new("flag", DataType::Boolean, true),
            Field::new("word", DataType::Utf8, true),
            Field::new("note", DataType::Utf8, true),
            Field::new("nothing", DataType::Utf8, true),
            Field::new("long", DataType::Utf8, true),
            Field::new("edge", DataType::Utf8, true),
        ]));
        let n = |i: usize| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let ids = FixedSizeBinaryArray::try_from_iter(
            (0..ROWS).map(|i| (i as u128 * 7 + 1).to_be_bytes()),
        )
        .unwrap();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(ids),
                Arc::new(Int16Array::from_iter(
                    (0..ROWS).map(|i| (i % 7 != 0).then_some((n(i) % 2000) as i16 - 1000)),
                )),
                Arc::new(Int32Array::from_iter(
                    (0..ROWS).map(|i| (i % 5 != 0).then_some(n(i) as i32)),
                )),
                Arc::new(Int64Array::from_iter(
                    (0..ROWS).map(|i| (i % 3 != 0).then_some(n(i) as i64)),
                )),
                Arc::new(BooleanArray::from_iter(
                    (0..ROWS).map(|i| (i % 11 != 0).then_some(i % 4 == 0)),
                )),
                Arc::new(StringArray::from_iter(
                    (0..ROWS).map(|i| (i % 13 != 0).then(|| format!("w{}", n(i) % 50))),
                )),
                Arc::new(StringArray::from_iter(
                    (0..ROWS).map(|i| (i % 2 == 0).then(|| format!("note {:016x}", n(i)))),
                )),
                Arc::new(StringArray::from_iter((0..ROWS).map(|_| None::<String>))),
                // Past the truncation length, with characters of 2 to 4 bytes across it: the
                // bounds are cut on character boundaries, the largest raised.
                Arc::new(StringArray::from_iter((0..ROWS).map(|i| {
                    (i % 17 != 0).then(|| format!("{}é€😀{:016x}", "x".repeat(55 + i % 9), n(i)))
                }))),
                // The largest character throughout: its bound cannot be raised, and stays whole.
                Arc::new(StringArray::from_iter(
                    (0..ROWS).map(|i| (i % 3 == 0).then(|| "\u{10FFFF}".repeat(20 + i % 2))),
                )),
            ],
        )
        .unwrap()
    }

    /// `batch` in a lake file as compaction writes it.
    fn lake_file(batch: &RecordBatch, name: &str) -> Bytes {
        let dir = std::env::temp_dir().join(format!("lakecdc-pages-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.parquet");
        let mut w = ParallelWriter::create(&path, batch.schema()).unwrap();
        w.write(batch, &[]).unwrap();
        w.close().unwrap();
        let out = Bytes::from(std::fs::read(&path).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        out
    }

    /// Every page header of a lake file reads back with the sizes its offset index and chunk
    /// metadata count: a header's length and its compressed size make the page's size, and
    /// the chunk's uncompressed size is the sum of headers and uncompressed pages.
    #[test]
    fn page_headers_add_up_to_the_chunk_sizes() {
        let file = lake_file(&batch(), "headers");
        let options = ReadOptionsBuilder::new().with_page_index().build();
        let reader = SerializedFileReader::new_with_options(file.clone(), options).unwrap();
        let meta = reader.metadata();
        let offsets = meta.offset_index().unwrap();
        let mut pages = 0;
        for (rg, group) in meta.row_groups().iter().enumerate() {
            for (c, chunk) in group.columns().iter().enumerate() {
                let locations = &offsets[rg][c].page_locations;
                let mut total = 0i64;
                if let Some(d) = chunk.dictionary_page_offset() {
                    let h = page_header(&file[d as usize..]).unwrap();
                    assert_eq!(
                        d + h.len as i64 + i64::from(h.compressed),
                        locations[0].offset
                    );
                    total += h.len as i64 + i64::from(h.uncompressed);
                }
                for p in locations {
                    let h = page_header(&file[p.offset as usize..]).unwrap();
                    assert_eq!(
                        h.len as i64 + i64::from(h.compressed),
                        i64::from(p.compressed_page_size)
                    );
                    total += h.len as i64 + i64::from(h.uncompressed);
                    pages += 1;
                }
                assert_eq!(total, chunk.uncompressed_size(), "column {c}");
            }
        }
        assert!(pages > 16, "{pages} pages");
        // Cut short or garbled, a header is refused.
        let first = offsets[0][0].page_locations[0].offset as usize;
        assert_eq!(page_header(&file[first..first + 3]), None);
        assert_eq!(page_header(&[0x15, 0xff, 0xff, 0xff]), None);
    }

    /// The statistics made from a run's rows are those the parquet writer makes encoding the
    /// same rows, for every flat lake type, with nulls, in parts, and for a column that holds
    /// only nulls.
    #[test]
    fn statistics_of_rows_are_the_writers() {
        let all = batch();
        for (from, len) in [(0, ROWS), (20_480, 20_480), (1000, 3)] {
            let rows = all.slice(from, len);
            let file = lake_file(&rows, &format!("stats-{from}"));
            let reader = SerializedFileReader::new(file).unwrap();
            let group = reader.metadata().row_group(0);
            for (i, field) in rows.schema().fields().iter().enumerate() {
                let chunk = group.column(i);
                let column = rows.column(i);
                // In three parts, as a run's rows arrive.
                let parts: Vec<ArrayRef> = [
                    (0, len / 3),
                    (len / 3, len / 3),
                    (2 * (len / 3), len - 2 * (len / 3)),
                ]
                .iter()
                .map(|&(a, n)| column.slice(a, n))
                .collect();
                let made = statistics(field, chunk.column_descr(), &parts, column.null_count());
                // As the footer holds them (a read-back statistic does not know whether the
                // deprecated fields were written: the writer writes them for signed orders).
                let seen = |s: Option<&Statistics>| {
                    s.map(|s| {
                        (
                            s.physical_type(),
                            s.min_bytes_opt().map(<[u8]>::to_vec),
                            s.max_bytes_opt().map(<[u8]>::to_vec),
                            s.null_count_opt(),
                            s.distinct_count_opt(),
                            s.min_is_exact(),
                            s.max_is_exact(),
                            // Without bounds, a reader calls them deprecated: none is written.
                            s.min_bytes_opt().is_some() && s.is_min_max_deprecated(),
                        )
                    })
                };
                let what = format!("{} rows {from}..", field.name());
                assert_eq!(seen(made.as_ref()), seen(chunk.statistics()), "{what}");
                if let Some(made) = &made {
                    assert_eq!(
                        made.is_min_max_backwards_compatible(),
                        chunk.column_descr().sort_order().is_signed(),
                        "{what}"
                    );
                }
            }
        }
    }
}
