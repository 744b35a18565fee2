//! The current state of a schema's listed files, streamed in `row_id` order (docs/design.md
//! §10): a k-way merge of the files (each sorted by `row_id`) keeping, per row, the copy the
//! read rule picks (highest `changed_at`; on a tie the tombstone). Only `row_id`, `changed_at`
//! and `deleted_at` are read — by ranged reads of their column chunks — unless a
//! [`RowHasher`] asks for every column (`verify --source --deep`). Files are opened in the
//! order of their listed lowest `row_id`, when the merge reaches it, and dropped once read, so
//! memory holds the footers and two row groups of the files that overlap the current row
//! (the deltas and one base, in a ranged lake), whatever the lake's size.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, FixedSizeBinaryArray};
use arrow::datatypes::{DataType, Int64Type};
use arrow::record_batch::RecordBatch;
use tokio::task::JoinHandle;

use super::manifest::FileEntry;
use super::ranges::parse_key;
use super::streamed::{self, Source};
use crate::error::{Error, Result};
use crate::store::ObjectStore;

/// The current copy — version and whether it is a tombstone — of each of `ids` (sorted, may
/// repeat) among the listed `files`, read from the files whose listed range can hold one of
/// them; `None` for an id no file holds. Used to find what the lake says of a few rows (gc's
/// unlisted deltas, a table source's requeue).
pub async fn listed_copies(
    store: Arc<dyn ObjectStore>,
    files: &[FileEntry],
    ids: &[u128],
) -> Result<Vec<Option<(i64, bool)>>> {
    let mut listed: Vec<Option<(i64, bool)>> = vec![None; ids.len()];
    let (Some(&lo), Some(&hi)) = (ids.first(), ids.last()) else {
        return Ok(listed);
    };
    let overlapping: Vec<FileEntry> = files
        .iter()
        .filter(|f| {
            let min = parse_key(&f.row_id_min).unwrap_or(0);
            let max = parse_key(&f.row_id_max).unwrap_or(u128::MAX);
            lo <= hi && min <= hi && max >= lo
        })
        .cloned()
        .collect();
    let mut state = CurrentState::new(store, overlapping, None);
    let mut next = 0;
    loop {
        let chunk = state.next_chunk(64 * 1024).await?;
        if chunk.is_empty() || next >= ids.len() {
            break;
        }
        for c in chunk {
            while ids.get(next).is_some_and(|r| *r < c.row_id) {
                next += 1;
            }
            let mut j = next;
            while ids.get(j).is_some_and(|r| *r == c.row_id) {
                listed[j] = Some((c.changed_at, c.tombstone));
                j += 1;
            }
        }
    }
    Ok(listed)
}

/// A row's current copy among the listed files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current {
    /// The row id, as a big-endian number (UUID byte order).
    pub row_id: u128,
    /// The copy's version.
    pub changed_at: i64,
    /// The copy is a tombstone (`deleted_at > 0`).
    pub tombstone: bool,
    /// The copy's values' hash ([`RowHasher`]), when asked for.
    pub hash: Option<u64>,
}

/// Hashes each row's values (every column but the version columns) so that the same values
/// hash the same whichever file, generation or writer they come from: columns are taken by
/// name in a fixed order, a missing one is NULL, and each is cast to the type it is hashed
/// as before Arrow's row format encodes it.
pub struct RowHasher {
    fields: Vec<(String, DataType)>,
    converter: arrow::row::RowConverter,
}

impl std::fmt::Debug for RowHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowHasher")
            .field("fields", &self.fields)
            .finish()
    }
}

/// Columns a row's hash leaves out: the version and tombstone columns, which the shallow
/// comparison already settles, and the schema id.
const UNHASHED: [&str; 3] = ["changed_at", "deleted_at", "schema_id"];

impl RowHasher {
    /// A hasher of the columns of `schema` (the columns a fresh export writes).
    pub fn new(schema: &arrow::datatypes::Schema) -> Result<Self> {
        Self::leaving_out(schema, &[])
    }

    /// A hasher of the columns of `schema` but `also` (besides the version columns): a table
    /// source's `ltbase_*` columns repeat its export version, which differs between exports of
    /// the same values (docs/design.md §9.3).
    pub fn leaving_out(schema: &arrow::datatypes::Schema, also: &[&str]) -> Result<Self> {
        let mut fields: Vec<(String, DataType)> = schema
            .fields()
            .iter()
            .filter(|f| {
                let name = f.name().as_str();
                !UNHASHED.contains(&name) && !also.contains(&name)
            })
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect();
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        let sort = fields
            .iter()
            .map(|(_, t)| arrow::row::SortField::new(t.clone()))
            .collect();
        let converter =
            arrow::row::RowConverter::new(sort).map_err(Error::arrow("prepare the row hasher"))?;
        Ok(Self { fields, converter })
    }

    /// The hash of each row of `batch`.
    pub fn hash(&self, batch: &RecordBatch) -> Result<Vec<u64>> {
        use std::hash::{Hash, Hasher};
        let rows = batch.num_rows();
        let columns = self
            .fields
            .iter()
            .map(|(name, t)| match batch.column_by_name(name) {
                None => Ok(arrow::array::new_null_array(t, rows)),
                Some(c) if c.data_type() == t => Ok(c.clone()),
                Some(c) => arrow::compute::cast(c, t).map_err(Error::arrow(format!(
                    "hash column {name}: {} as {t}",
                    c.data_type()
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let converted = self
            .converter
            .convert_columns(&columns)
            .map_err(Error::arrow("encode rows for hashing"))?;
        Ok(converted
            .iter()
            .map(|r| {
                // SipHash with fixed keys: the same bytes hash the same in every run.
                let mut h = std::hash::DefaultHasher::new();
                r.as_ref().hash(&mut h);
                h.finish()
            })
            .collect())
    }
}

/// One decoded row group: its rows' ids, versions, tombstones and (deep) hashes.
#[derive(Debug, Default)]
struct Run {
    ids: Vec<u128>,
    changed: Vec<i64>,
    tombstone: Vec<bool>,
    hashes: Option<Vec<u64>>,
    pos: usize,
}

impl Run {
    fn head(&self) -> Option<u128> {
        self.ids.get(self.pos).copied()
    }

    fn current(&self, i: usize) -> Current {
        Current {
            row_id: self.ids[i],
            changed_at: self.changed[i],
            tombstone: self.tombstone[i],
            hash: self.hashes.as_ref().map(|h| h[i]),
        }
    }

    fn of(src: &Source, batches: &[RecordBatch], hasher: Option<&RowHasher>) -> Result<Self> {
        let rows = batches.iter().map(RecordBatch::num_rows).sum();
        let mut run = Run {
            ids: Vec::with_capacity(rows),
            changed: Vec::with_capacity(rows),
            tombstone: Vec::with_capacity(rows),
            hashes: hasher.map(|_| Vec::with_capacity(rows)),
            pos: 0,
        };
        let bad = |what: &str| Error::Parquet {
            path: src.entry.path.clone(),
            message: format!("column {what} has an unexpected type"),
        };
        for b in batches {
            let col = |name: &str| b.column_by_name(name).ok_or_else(|| bad(name));
            let ids = col("row_id")?
                .as_any()
                .downcast_ref::<FixedSizeBinaryArray>()
                .filter(|a| a.value_length() == 16)
                .ok_or_else(|| bad("row_id"))?;
            let changed = col("changed_at")?
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| bad("changed_at"))?;
            let deleted = col("deleted_at")?
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| bad("deleted_at"))?;
            for i in 0..b.num_rows() {
                let id: [u8; 16] = ids.value(i).try_into().map_err(|_| bad("row_id"))?;
                let id = u128::from_be_bytes(id);
                if run.ids.last().is_some_and(|p| *p >= id) || ids.is_null(i) {
                    return Err(Error::Parquet {
                        path: src.entry.path.clone(),
                        message: "rows are not sorted by row_id with one copy each".into(),
                    });
                }
                run.ids.push(id);
                run.changed.push(changed.value(i));
                run.tombstone
                    .push(deleted.is_valid(i) && deleted.value(i) > 0);
            }
            if let (Some(h), Some(out)) = (hasher, run.hashes.as_mut()) {
                out.extend(h.hash(b)?);
            }
        }
        Ok(run)
    }
}

/// A file being read: its footer, the row group decoded and the next one on its way.
struct Cursor {
    src: Arc<Source>,
    run: Run,
    next_rg: usize,
    ahead: Option<JoinHandle<Result<Run>>>,
}

/// What the merge's heap orders: a file not yet opened (at its listed lowest id) or an open
/// file (at its current row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Slot {
    /// Index into the cursors.
    Open(usize),
    /// Index into the files not yet opened.
    Pending(usize),
}

/// Footers read ahead of the merge: the next files, by listed lowest id, are opened while
/// the current ones are read, so a lake of many small bases does not wait on each footer.
const OPEN_AHEAD: usize = 4;

/// The stream of [`Current`] rows.
pub struct CurrentState {
    store: Arc<dyn ObjectStore>,
    files: Vec<Option<FileEntry>>,
    /// File indexes in the order of their listed lowest id, and how many were opened (or
    /// started opening) ahead.
    order: Vec<usize>,
    next_ahead: usize,
    opening: std::collections::HashMap<usize, JoinHandle<Result<Source>>>,
    cursors: Vec<Option<Cursor>>,
    heap: BinaryHeap<Reverse<(u128, Slot)>>,
    hasher: Option<Arc<RowHasher>>,
    last: Option<u128>,
    /// Files opened so far.
    pub files_read: usize,
}

impl std::fmt::Debug for CurrentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurrentState")
            .field("files", &self.files.len())
            .field("files_read", &self.files_read)
            .finish()
    }
}

impl CurrentState {
    /// The current state of `files` (listed entries of one schema, already checked to be its
    /// data files). With `hasher`, every column is read and each row's values hashed.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        files: Vec<FileEntry>,
        hasher: Option<Arc<RowHasher>>,
    ) -> Self {
        let mut heap = BinaryHeap::with_capacity(files.len());
        let mut order = Vec::with_capacity(files.len());
        for (i, f) in files.iter().enumerate() {
            // A file whose lowest id is unknown is opened first.
            let min = parse_key(&f.row_id_min).unwrap_or(0);
            heap.push(Reverse((min, Slot::Pending(i))));
            order.push((min, i));
        }
        order.sort_unstable();
        Self {
            store,
            files: files.into_iter().map(Some).collect(),
            order: order.into_iter().map(|(_, i)| i).collect(),
            next_ahead: 0,
            opening: Default::default(),
            cursors: Vec::new(),
            heap,
            hasher,
            last: None,
            files_read: 0,
        }
    }

    fn columns(&self) -> Option<Vec<&'static str>> {
        match self.hasher {
            Some(_) => None,
            None => Some(vec!["row_id", "changed_at", "deleted_at"]),
        }
    }

    /// Starts reading row group `rg` of `src`.
    fn spawn_load(&self, src: &Arc<Source>, rg: usize) -> JoinHandle<Result<Run>> {
        let (store, src, hasher) = (self.store.clone(), src.clone(), self.hasher.clone());
        let names = self.columns();
        tokio::spawn(async move {
            let cols = names.map(|n| src.flat_columns(&n)).transpose()?;
            let batches = src
                .read_group(
                    store.as_ref(),
                    rg,
                    cols.as_ref().map(|(r, l)| (r.as_slice(), l.as_slice())),
                )
                .await?;
            let s = src.clone();
            tokio::task::spawn_blocking(move || Run::of(&s, &batches, hasher.as_deref()))
                .await
                .map_err(Error::task("read row versions"))?
        })
    }

    /// Starts reading the footers of the next files (by listed lowest id) not opened yet.
    fn open_ahead(&mut self) {
        while self.opening.len() < OPEN_AHEAD && self.next_ahead < self.order.len() {
            let i = self.order[self.next_ahead];
            self.next_ahead += 1;
            if let Some(entry) = self.files.get_mut(i).and_then(Option::take) {
                let store = self.store.clone();
                self.opening.insert(
                    i,
                    tokio::spawn(async move { streamed::open(store.as_ref(), &entry).await }),
                );
            }
        }
    }

    /// Opens pending file `i`: its footer (read ahead when it could be) and first row group
    /// (the second one ahead).
    async fn open(&mut self, i: usize) -> Result<()> {
        let src = match (
            self.opening.remove(&i),
            self.files.get_mut(i).and_then(Option::take),
        ) {
            (Some(ahead), _) => ahead.await.map_err(Error::task("read a footer"))??,
            (None, Some(entry)) => streamed::open(self.store.as_ref(), &entry).await?,
            (None, None) => return Err(Error::Invariant("a file opened twice".into())),
        };
        self.open_ahead();
        let src = Arc::new(src);
        self.files_read += 1;
        let groups = src.meta.num_row_groups();
        let mut cursor = Cursor {
            run: Run::default(),
            next_rg: 0,
            ahead: None,
            src,
        };
        if groups > 0 {
            cursor.ahead = Some(self.spawn_load(&cursor.src, 0));
            cursor.next_rg = 1;
        }
        let slot = self.cursors.len();
        self.cursors.push(Some(cursor));
        self.advance(slot).await
    }

    /// Makes cursor `slot`'s head the next row, loading its next row group when the run is
    /// used up, and puts it back on the heap; a finished file is dropped.
    async fn advance(&mut self, slot: usize) -> Result<()> {
        loop {
            let Some(c) = self.cursors.get_mut(slot).and_then(Option::as_mut) else {
                return Err(Error::Invariant("a cursor of no file".into()));
            };
            if let Some(id) = c.run.head() {
                self.heap.push(Reverse((id, Slot::Open(slot))));
                return Ok(());
            }
            let Some(ahead) = c.ahead.take() else {
                self.cursors[slot] = None;
                return Ok(());
            };
            let run = ahead.await.map_err(Error::task("read row versions"))??;
            // A row group's first row must follow the previous one's last.
            if let (Some(prev), Some(first)) = (c.run.ids.last(), run.ids.first())
                && first <= prev
            {
                return Err(Error::Parquet {
                    path: c.src.entry.path.clone(),
                    message: "rows are not sorted by row_id with one copy each".into(),
                });
            }
            c.run = run;
            if c.next_rg < c.src.meta.num_row_groups() {
                let (src, rg) = (c.src.clone(), c.next_rg);
                let load = self.spawn_load(&src, rg);
                if let Some(c) = self.cursors[slot].as_mut() {
                    c.ahead = Some(load);
                    c.next_rg += 1;
                }
            }
        }
    }

    /// Up to `max` next rows of the current state (tombstones included), in `row_id` order;
    /// empty at the end.
    pub async fn next_chunk(&mut self, max: usize) -> Result<Vec<Current>> {
        let mut out = Vec::with_capacity(max.min(1 << 16));
        while out.len() < max {
            let Some(Reverse((id, slot))) = self.heap.pop() else {
                break;
            };
            let slot = match slot {
                Slot::Pending(i) => {
                    self.open(i).await?;
                    continue;
                }
                Slot::Open(s) => s,
            };
            // Every other copy of this row, and files listed as starting at it.
            let mut best = self.take(slot)?;
            while let Some(Reverse((next, other))) = self.heap.peek().copied() {
                if next != id {
                    break;
                }
                self.heap.pop();
                match other {
                    Slot::Pending(i) => self.open(i).await?,
                    Slot::Open(s) => {
                        let copy = self.take(s)?;
                        best = wins(best, copy);
                        self.advance(s).await?;
                    }
                }
            }
            if self.last.is_some_and(|l| l >= id) {
                let path = self.cursors[slot]
                    .as_ref()
                    .map_or_else(String::new, |c| c.src.entry.path.clone());
                return Err(Error::Parquet {
                    path,
                    message: "holds rows below its listed row_id_min".into(),
                });
            }
            self.last = Some(id);
            out.push(best);
            // The rest of this file's run below every other file's head needs no heap.
            let bound = self.heap.peek().map(|Reverse((n, _))| *n);
            if let Some(c) = self.cursors[slot].as_mut() {
                while out.len() < max {
                    match c.run.head() {
                        Some(n) if bound.is_none_or(|b| n < b) => {
                            out.push(c.run.current(c.run.pos));
                            c.run.pos += 1;
                            self.last = Some(n);
                        }
                        _ => break,
                    }
                }
            }
            self.advance(slot).await?;
        }
        Ok(out)
    }

    /// The head row of cursor `slot`, consumed.
    fn take(&mut self, slot: usize) -> Result<Current> {
        let c = self
            .cursors
            .get_mut(slot)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Invariant("a cursor of no file".into()))?;
        let row = c.run.current(c.run.pos);
        c.run.pos += 1;
        Ok(row)
    }
}

/// The read rule between two copies of a row (docs/design.md §3.1): whether the copy at
/// version `changed_at` (a tombstone when `tombstone`) supersedes the copy `than` — the higher
/// version, and on a tie the tombstone. Every reader and the compaction merge apply it.
pub fn supersedes(changed_at: i64, tombstone: bool, than: (i64, bool)) -> bool {
    changed_at > than.0 || (changed_at == than.0 && tombstone && !than.1)
}

/// The copy [`supersedes`] picks of two.
fn wins(a: Current, b: Current) -> Current {
    if supersedes(b.changed_at, b.tombstone, (a.changed_at, a.tombstone)) {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_copy_wins_and_a_tombstone_wins_a_tie() {
        let c = |changed_at, tombstone| Current {
            row_id: 1,
            changed_at,
            tombstone,
            hash: None,
        };
        assert_eq!(wins(c(1, false), c(2, false)), c(2, false));
        assert_eq!(wins(c(3, true), c(2, false)), c(3, true));
        assert_eq!(wins(c(2, false), c(2, true)), c(2, true));
        assert_eq!(wins(c(2, true), c(2, false)), c(2, true));
    }
}
