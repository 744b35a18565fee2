//! A flush pass in heap order: a large backlog of scattered row ids read by scanning the
//! tables once (docs/design.md §4.1, "Heap passes").
//!
//! Batch reads look their rows up by id. With random ids (UUIDv4, imported data) each batch's
//! rows lie on heap pages all over the entity and EAV tables, so a backlog that covers much of
//! the table reads every heap page again for nearly every batch. A pass instead selects the
//! oldest dirty slots (up to [`PASS_SLOTS`]) in one exported snapshot, sorts them by row id and
//! cuts them into batches exactly as windows are cut; two readers then scan both tables'
//! heaps in that snapshot and spill every row into the bucket of the batch whose row-id range
//! holds it (`source::heap_read`). Each batch is then loaded from its bucket and exported,
//! committed and marked like any other: the slots and the payload come from the same
//! snapshot (docs/hazards.md #45), the mark still checks each slot's version, and the export's
//! join drops the rows of a bucket that are not its batch's.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;

use super::read_ahead::Fetched;
use super::{Hook, step_done};
use crate::config::Tables;
use crate::error::{Error, Result};
use crate::job::{self, Context};
use crate::schema::SchemaDef;
use crate::source::Client;
use crate::source::connect::TappedClient;
use crate::source::heap_read::{self, PassSlot, ReadOrder, Spilled, TableShape};
use crate::source::live::{self, LivePage};
use crate::source::snapshot::{Selected, Snapshot};

/// The most dirty slots one pass selects (about 48 bytes each while the pass lasts); a larger
/// backlog takes further passes or windows.
pub(super) const PASS_SLOTS: u64 = 2_000_000;

/// Rows per heap range a reader reads in one statement.
const CHUNK_ROWS: u64 = 100_000;

/// Readers scanning the heap at once.
const READERS: usize = 2;

/// What a pass needs from the flush of one schema.
pub(super) struct PassPlan<'a> {
    pub ctx: &'a Context,
    pub tables: &'a Tables,
    pub def: &'a SchemaDef,
    pub schema_id: i16,
    pub order: ReadOrder,
    pub batch_size: i64,
    /// The schema's dirty slots.
    pub dirty: u64,
    /// The slots the run's batch budget allows (`--max-batches`; `u64::MAX` without one).
    pub budget: u64,
    pub dry_run: bool,
    pub work_dir: &'a Path,
    /// Called with the pass's row ids between its selection and its heap read (a test seam).
    pub before_export: Option<Hook>,
    /// Called before the pass opens its sessions (a test seam).
    pub before_sessions: Option<Hook>,
}

/// A pass whose heap is read: its batches, loaded from the spill one ahead of the export.
pub(super) struct HeapPass {
    /// The pass's slots in row-id order; batch `i` is the `i`-th run of `size` of them.
    slots: Vec<PassSlot>,
    size: usize,
    /// Slots handed out so far (whole batches).
    taken: usize,
    spilled: Option<Arc<Spilled>>,
    def: SchemaDef,
    /// The load of the next batch's bucket, in flight.
    loading: Option<JoinHandle<Result<Option<LivePage>>>>,
    /// Rows of the scanned tables spilled to scratch disk.
    pub scratch_bytes: u64,
    /// The pass's last slot by `(changed_at, row_id)`, when the pass holds every slot dirty
    /// in its snapshot up to it: where the windows after the pass start ([`Self::windows_after`]).
    after: Option<Selected>,
}

impl HeapPass {
    /// Decides whether the next dirty slots (at most the budget) are read as a heap pass and,
    /// if so, selects them and reads the heap (a dry run only selects). `None`: read by windows.
    pub(super) async fn start(plan: &PassPlan<'_>, client: &Client) -> Result<Option<Self>> {
        // The most slots the pass may take: the dirty ones, at most the budget and a pass.
        let pass = plan.dirty.min(plan.budget).min(PASS_SLOTS);
        if !TableShape::may_pass(plan.order, pass) {
            return Ok(None);
        }
        let shape = TableShape::read(client, plan.tables).await?;
        if !shape.heap_pass(plan.order, pass) || !fits(plan, shape.pass_scratch())? {
            return Ok(None);
        }
        let started = Instant::now();
        let Some(sessions) = Sessions::open(plan).await? else {
            return Ok(None);
        };
        let snapshot = live::ExportedSnapshot::export_on(sessions.exporter).await?;
        // One ticket per session the selection runs on, and one per reader for the heap read.
        let selectors = match oldest(plan, pass) {
            true => 1,
            false => READERS,
        };
        let tickets = |n: usize| (0..n).map(|_| snapshot.ticket()).collect::<Vec<_>>();
        let (selection, reading) = (tickets(selectors), tickets(READERS));
        let released = snapshot.release();
        let read = Self::read(plan, &shape, sessions.readers, selection, reading, pass);
        let (pass, released) = tokio::join!(read, released);
        let pass = released.and(pass)?;
        tracing::info!(
            schema_id = plan.schema_id,
            batches = pass.slots.len().div_ceil(pass.size),
            scratch_bytes = pass.scratch_bytes,
            read_ms = started.elapsed().as_millis() as u64,
            "flush read a pass in heap order"
        );
        Ok(Some(pass))
    }

    /// Selects the pass's slots (a ticket of `selection` per session it runs on) and reads
    /// its buckets (a ticket of `reading` per reader), all in the same snapshot.
    async fn read(
        plan: &PassPlan<'_>,
        shape: &TableShape,
        mut readers: Vec<TappedClient>,
        mut selection: Vec<live::SnapshotTicket>,
        tickets: Vec<live::SnapshotTicket>,
        pass: u64,
    ) -> Result<Self> {
        let t = Instant::now();
        // Only a pass that cannot take every dirty slot (bounded by PASS_SLOTS or the batch
        // budget) needs the oldest ones: one ordered selection, on the first reader's session
        // before it reads. One that can takes whatever is dirty in its snapshot (slots written
        // since the count too), up to what a pass and the budget allow, split over every
        // reader's session by heap pages.
        let oldest = oldest(plan, pass);
        let limit = match oldest {
            true => pass,
            false => PASS_SLOTS.min(plan.budget),
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut slots = match oldest {
            true => {
                let ticket = selection
                    .pop()
                    .ok_or_else(|| Error::Invariant("a pass without a snapshot ticket".into()))?;
                let selector = readers
                    .first_mut()
                    .ok_or_else(|| Error::Invariant("a pass without a reader".into()))?;
                let (tables, id) = (plan.tables, plan.schema_id);
                let mut slots = heap_read::dirty_slots_in(
                    selector, ticket, tables, id, limit, true, None, pass,
                )
                .await?;
                slots.sort_unstable_by_key(|s| s.slot.row_id);
                slots
            }
            // Sorted by row id as it is merged.
            false => {
                let ranges = shape.slot_ranges(readers.len());
                heap_read::dirty_slots_split(
                    &mut readers,
                    selection,
                    plan.tables,
                    plan.schema_id,
                    limit,
                    &ranges,
                    pass,
                )
                .await?
            }
        };
        step_done("select pass", t);
        let took_all = i64::try_from(slots.len()).unwrap_or(i64::MAX) < limit;
        // A split selection may hold up to `limit` slots per reader.
        slots.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let after = last_selected(&slots).filter(|_| oldest || took_all);
        if let Some(hook) = &plan.before_export {
            hook(
                plan.schema_id,
                slots.iter().map(|s| s.slot.row_id).collect(),
            )
            .await;
        }
        let size = usize::try_from(plan.batch_size.max(1)).unwrap_or(usize::MAX);
        if plan.dry_run {
            return Ok(Self {
                slots,
                size,
                taken: 0,
                spilled: None,
                def: plan.def.clone(),
                loading: None,
                scratch_bytes: 0,
                after,
            });
        }
        // Batch i's rows go to bucket i: the cuts are each later batch's first row id.
        let cuts: Vec<u128> = slots
            .iter()
            .step_by(size)
            .skip(1)
            .map(|s| s.slot.row_id.as_u128())
            .collect();
        let heap = shape.pass_plan(cuts, CHUNK_ROWS);
        let shutdown = plan.ctx.shutdown.clone();
        let after_chunk = move || {
            let shutdown = shutdown.clone();
            // A stop ends the read at once: nothing of the pass is exported yet.
            async move {
                match shutdown.is_requested() {
                    true => Err(Error::Stopped),
                    false => Ok(()),
                }
            }
        };
        let t = Instant::now();
        let spilled = heap_read::read_buckets(
            readers,
            tickets,
            plan.tables,
            plan.def,
            plan.schema_id,
            &heap,
            plan.work_dir,
            after_chunk,
        )
        .await?;
        step_done("read pass heap", t);
        Ok(Self {
            slots,
            size,
            taken: 0,
            scratch_bytes: spilled.bytes(),
            spilled: Some(Arc::new(spilled)),
            def: plan.def.clone(),
            loading: None,
            after,
        })
    }

    /// Where the windows after this pass start selecting (keyset paging, as a window follows
    /// the one before it): past the pass's last slot by `(changed_at, row_id)` when the pass
    /// holds every slot dirty in its snapshot up to that one (it took the oldest slots, or all
    /// of them). The windows then never walk the pass's own slots, which its marks leave as
    /// dead entries of the dirty-slot index until a vacuum: a million of them took the first
    /// window 0.7 s of PostgreSQL CPU, alone at the end of the run (docs/design.md §4.1,
    /// "Heap passes"). A slot committed since the pass with a version at or below that point
    /// is left dirty for the next run, as the windows leave one below their own position.
    pub(super) fn windows_after(&self) -> Option<Selected> {
        self.after
    }

    /// Slots the pass has yet to hand out.
    pub(super) fn slots_left(&self) -> usize {
        self.slots.len().saturating_sub(self.taken)
    }

    /// The next batch's slots, taken.
    fn take(&mut self) -> &[PassSlot] {
        let from = self.taken.min(self.slots.len());
        self.taken = from.saturating_add(self.size).min(self.slots.len());
        &self.slots[from..self.taken]
    }

    /// The next batch in row-id order, or `None` when the pass is done. The bucket after it
    /// starts loading at once. Cancel-safe: a call dropped while its bucket loads leaves the
    /// batch and the load for the next call.
    pub(super) async fn next(&mut self) -> Result<Option<Fetched>> {
        if self.slots_left() == 0 {
            return Ok(None);
        }
        let Some(spilled) = self.spilled.clone() else {
            let slots = self.take().iter().map(|s| s.slot).collect();
            return Ok(Some(Fetched::Planned(slots)));
        };
        if self.loading.is_none() {
            self.loading = Some(self.load(&spilled));
        }
        let Some(loading) = &mut self.loading else {
            return Err(Error::Invariant("a pass bucket without its load".into()));
        };
        let page = loading.await.map_err(Error::task("load a pass bucket"));
        self.loading = None;
        let page = page??;
        let page = match page {
            Some(page) => page,
            None => live::empty_live_page(&self.def)?,
        };
        let slots = self.take();
        let snapshot = Snapshot {
            change_log: heap_read::change_log_of(slots)?,
            entities: page.entities,
            eav: page.eav,
            versions: slots.iter().map(|s| s.slot).collect(),
            by_range: true,
        };
        if self.slots_left() > 0 {
            self.loading = Some(self.load(&spilled));
        }
        Ok(Some(Fetched::Read(snapshot)))
    }

    /// Starts loading the bucket of the next batch to take (blocking file reads and decoding):
    /// batch `i` is bucket `i`.
    fn load(&self, spilled: &Arc<Spilled>) -> JoinHandle<Result<Option<LivePage>>> {
        let (s, bucket) = (spilled.clone(), self.taken / self.size);
        tokio::task::spawn_blocking(move || s.load(bucket))
    }
}

/// Whether a pass of `pass` slots takes the oldest dirty ones (it cannot take them all), not
/// any.
fn oldest(plan: &PassPlan<'_>, pass: u64) -> bool {
    pass < plan.dirty
}

/// The last of `slots` in selection order, `(changed_at, row_id)`.
fn last_selected(slots: &[PassSlot]) -> Option<Selected> {
    slots
        .iter()
        .map(|s| s.slot)
        .max_by_key(|s| (s.changed_at, s.row_id))
}

/// The sessions a pass opens besides the run's own: the snapshot's exporter and the heap
/// readers (the first also selects the pass's slots).
struct Sessions {
    exporter: Client,
    readers: Vec<TappedClient>,
}

impl Sessions {
    /// Opens them all before anything is read. When one cannot be opened (a connection limit,
    /// a database refusing connections), `--read-order auto` reads by windows instead, on the
    /// run's own connections, with a warning (`None`); an explicit `heap` fails the run.
    async fn open(plan: &PassPlan<'_>) -> Result<Option<Self>> {
        let connector = &plan.ctx.connector;
        if let Some(hook) = &plan.before_sessions {
            hook(plan.schema_id, Vec::new()).await;
        }
        let opened = tokio::try_join!(
            connector.connect(),
            heap_read::open_readers(connector, READERS)
        )
        .map(|(exporter, readers)| Self { exporter, readers });
        match opened {
            Ok(sessions) => Ok(Some(sessions)),
            Err(e) if plan.order == ReadOrder::Auto => {
                tracing::warn!(
                    schema_id = plan.schema_id,
                    error = %e,
                    "a heap pass could not open its {} connections: reading by windows",
                    READERS + 1
                );
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether the work dir has room for a pass's spill of `needed` bytes: `auto` reads by windows
/// instead (no scratch disk), an explicit `--read-order heap` is refused.
fn fits(plan: &PassPlan<'_>, needed: u64) -> Result<bool> {
    let free = job::available_bytes(plan.work_dir).map_err(|source| Error::Io {
        op: "measure free space of work dir",
        path: plan.work_dir.to_path_buf(),
        source,
    })?;
    let step = "a flush heap pass (its spill; --read-order row-id needs none)";
    let fits = job::spill_fits(plan.order, plan.work_dir, step, needed, free)?;
    if !fits {
        tracing::warn!(
            schema_id = plan.schema_id,
            needed,
            free,
            work_dir = %plan.work_dir.display(),
            "not enough free space for a heap pass: reading by windows"
        );
    }
    Ok(fits)
}

impl Drop for HeapPass {
    fn drop(&mut self) {
        if let Some(l) = &self.loading {
            l.abort();
        }
    }
}
