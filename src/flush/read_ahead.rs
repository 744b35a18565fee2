//! Batch reads running ahead of the export, on up to two connections.
//!
//! Slots are selected in windows: the oldest `window_batches` batches' worth of dirty slots by
//! `(changed_at, row_id)` (keyset paging, so a run never revisits a slot it has planned), sorted
//! by `row_id` and cut into batches (docs/design.md §4.1). A batch is then a narrow slice of the
//! row-id space, whatever the id order: its entity, EAV and mark statements work on a few
//! neighbouring index leaves instead of leaves all over the indexes, which is what made random
//! (UUIDv4) ids cost twice as much as time-ordered ones. The oldest rows still go first, a
//! window at a time.
//!
//! Each batch reads its slots again, and then their payload, in its own repeatable-read
//! snapshot, on whichever of the two connections is free, so batch k+1 is read while batch k's
//! rows are still being decoded: PostgreSQL serves two reads at once and the drain seldom
//! waits for one. Batches come out in the order they were cut; reads still in flight when the
//! drain stops are aborted (they write nothing). When the second connection cannot be opened
//! (a connection limit), the reads take turns on the first.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

use super::{Hook, step_done};
use crate::config::Tables;
use crate::error::{Error, Result};
use crate::schema::SchemaDef;
use crate::source::Connector;
use crate::source::connect::TappedClient;
use crate::source::snapshot::{self, BatchStatements, Selected, Snapshot};

/// A batch: a dry run's selection, or a selection with its snapshot.
pub(super) enum Fetched {
    /// The slots a dry run would export.
    Planned(Vec<Selected>),
    /// The slots selected (`versions`) and their rows.
    Read(Snapshot),
}

impl Fetched {
    /// The slots of the batch.
    pub(super) fn slots(&self) -> &[Selected] {
        match self {
            Fetched::Planned(slots) => slots,
            Fetched::Read(snap) => &snap.versions,
        }
    }
}

/// What every batch read of one schema's drain needs.
pub(super) struct Plan {
    pub connector: Connector,
    pub tables: Tables,
    pub def: SchemaDef,
    pub schema_id: i16,
    pub batch_size: i64,
    /// Batches cut from one selection window.
    pub window_batches: u32,
    /// Select only; read no snapshot.
    pub dry_run: bool,
    /// Read no more batches than this (`--max-batches`).
    pub max_batches: Option<u32>,
    /// Where the first window starts: past this slot (after a heap pass), or at the oldest.
    pub start_after: Option<Selected>,
    /// Called between a batch's selection and its payload read.
    pub before_payload: Option<Hook>,
    /// Called before the second connection is opened (a test seam).
    pub before_second_connection: Option<Hook>,
}

/// A read connection with its prepared batch statements.
struct Conn {
    conn: TappedClient,
    stmts: BatchStatements,
}

impl Conn {
    /// Prepares the batch statements on `conn`, already tuned for lookups.
    async fn prepare(conn: TappedClient, plan: &Plan) -> Result<Self> {
        let stmts = BatchStatements::prepare(&conn.client, &plan.tables, &plan.def).await?;
        Ok(Self { conn, stmts })
    }

    /// Opens, tunes and prepares a second read connection.
    async fn open(plan: &Plan) -> Result<Self> {
        let conn = plan.connector.connect_tapped().await?;
        snapshot::tune_for_lookups(&conn.client).await?;
        Self::prepare(conn, plan).await
    }
}

/// The read connections not reading now. The first is there from the start; a second is
/// opened (once) when a read finds none free.
struct Pool {
    idle: Mutex<Vec<Conn>>,
    released: Notify,
    /// Whether the second connection is still to be tried.
    may_open: AtomicBool,
}

impl Pool {
    /// A free connection: an idle one, else a new second one, else the next one released.
    async fn acquire(&self, plan: &Plan) -> Conn {
        loop {
            if let Some(conn) = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()
            {
                return conn;
            }
            if self.may_open.swap(false, Ordering::SeqCst) {
                if let Some(hook) = &plan.before_second_connection {
                    hook(plan.schema_id, Vec::new()).await;
                }
                match Conn::open(plan).await {
                    Ok(conn) => return conn,
                    Err(e) => tracing::warn!(
                        error = %e.chain(),
                        "no second read connection; batches are read one after the other"
                    ),
                }
            }
            // A release between the check above and here leaves a permit: no wake-up is lost.
            self.released.notified().await;
        }
    }

    fn release(&self, conn: Conn) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
        self.released.notify_one();
    }
}

/// What the selection has planned so far, handed from each batch's read to the next one's.
#[derive(Default)]
struct Windows {
    /// Batches cut and not yet taken, in order.
    cut: VecDeque<Vec<Selected>>,
    /// Where the next window starts (the last slot of the one before).
    after: Option<Selected>,
    /// The last window was not full: nothing is left to select.
    exhausted: bool,
}

impl Windows {
    /// The next batch's slots, selecting the next window on `conn` when none is cut; `None`
    /// when nothing is left.
    async fn take(&mut self, plan: &Plan, conn: &Conn) -> Result<Option<Vec<Selected>>> {
        if self.cut.is_empty() && !self.exhausted {
            let t = Instant::now();
            // No more slots than the run may export (`--max-batches`).
            let batches = plan
                .max_batches
                .map_or(plan.window_batches, |m| m.min(plan.window_batches));
            let limit = window_rows(plan.batch_size, batches);
            let window = snapshot::select(
                &conn.conn.client,
                &conn.stmts,
                plan.schema_id,
                limit,
                self.after,
            )
            .await?;
            step_done("select window", t);
            self.exhausted = i64::try_from(window.len()).unwrap_or(i64::MAX) < limit;
            self.after = window.last().copied();
            self.cut = cut(window, plan.batch_size);
        }
        Ok(self.cut.pop_front())
    }
}

/// The most slots one window selects beyond a single batch: the window's slots (about 40
/// bytes each; the selection streams into them) are held until its batches are taken.
const WINDOW_MAX_ROWS: i64 = 200_000;

/// Slots per window: `window_batches` batches, at most [`WINDOW_MAX_ROWS`] unless one batch is
/// larger.
fn window_rows(batch_size: i64, window_batches: u32) -> i64 {
    let batch = batch_size.max(1);
    batch
        .saturating_mul(i64::from(window_batches.max(1)))
        .min(WINDOW_MAX_ROWS.max(batch))
}

/// Sorts a window by row id and cuts it into batches of at most `batch_size` slots.
fn cut(mut window: Vec<Selected>, batch_size: i64) -> VecDeque<Vec<Selected>> {
    window.sort_unstable_by_key(|s| s.row_id);
    let size = usize::try_from(batch_size.max(1)).unwrap_or(usize::MAX);
    window.chunks(size).map(<[Selected]>::to_vec).collect()
}

/// Hands the windows on to the next batch's read once this one has taken its slots.
type Cursor = oneshot::Sender<Windows>;

type Read = JoinHandle<Result<Option<(Conn, Fetched)>>>;

/// The batch reads in flight, oldest first.
pub(super) struct ReadAhead {
    plan: Arc<Plan>,
    pool: Arc<Pool>,
    reads: VecDeque<Read>,
    /// Reads started so far.
    started: u32,
    /// Where the batch after the newest read starts, once that read's selection is known.
    newest: Option<oneshot::Receiver<Windows>>,
}

impl ReadAhead {
    /// Starts reading the first batch on `conn` (tuned for lookups) and the second on a
    /// connection opened only once the first selection turns out full.
    pub(super) async fn start(plan: Plan, conn: TappedClient) -> Result<Self> {
        let plan = Arc::new(plan);
        let conn = Conn::prepare(conn, &plan).await?;
        let mut ahead = Self {
            plan,
            pool: Arc::new(Pool {
                idle: Mutex::new(vec![conn]),
                released: Notify::new(),
                may_open: AtomicBool::new(true),
            }),
            reads: VecDeque::new(),
            started: 0,
            newest: None,
        };
        let (cursor, first) = oneshot::channel();
        ahead.spawn(None, cursor);
        ahead.newest = Some(first);
        ahead.spawn_next();
        Ok(ahead)
    }

    /// The next batch in selection order, or `None` when no slot is left. Its connection goes
    /// back to the pool and a read of a later batch starts.
    pub(super) async fn next(&mut self) -> Result<Option<Fetched>> {
        // Taken off the queue only once finished, so a read is aborted with the queue even
        // if this future is dropped while waiting for it.
        let Some(read) = self.reads.front_mut() else {
            return Ok(None);
        };
        let joined = read.await;
        self.reads.pop_front();
        let done = joined.map_err(Error::task("batch read"))??;
        Ok(done.map(|(conn, fetched)| {
            self.pool.release(conn);
            self.spawn_next();
            fetched
        }))
    }

    /// Starts the read after the newest one.
    fn spawn_next(&mut self) {
        if let Some(previous) = self.newest.take() {
            let (cursor, next) = oneshot::channel();
            self.spawn(Some(previous), cursor);
            self.newest = Some(next);
        }
    }

    /// Starts a read after the one `previous` tells of (or the first), unless `--max-batches`
    /// reads are started already.
    fn spawn(&mut self, previous: Option<oneshot::Receiver<Windows>>, cursor: Cursor) {
        if self.plan.max_batches.is_some_and(|m| self.started >= m) {
            return;
        }
        let (plan, pool) = (self.plan.clone(), self.pool.clone());
        self.started += 1;
        self.reads.push_back(tokio::spawn(async move {
            let windows = match previous {
                None => Windows {
                    after: plan.start_after,
                    ..Windows::default()
                },
                Some(rx) => match rx.await {
                    Ok(windows) => windows,
                    // The read before failed (it reports that).
                    Err(_) => return Ok(None),
                },
            };
            let conn = pool.acquire(&plan).await;
            read(&plan, conn, windows, cursor).await
        }));
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        for read in &self.reads {
            read.abort();
        }
    }
}

/// Steps 1 and 2 for the next batch: its slots from the windows (selecting the next window
/// when needed), then, in one snapshot, its slots again and their payload (in a dry run only
/// the slots). `None` when no slot is left. The windows go on to the next read as soon as this
/// batch has taken its slots.
async fn read(
    plan: &Plan,
    mut conn: Conn,
    mut windows: Windows,
    cursor: Cursor,
) -> Result<Option<(Conn, Fetched)>> {
    let schema_id = plan.schema_id;
    let slots = windows.take(plan, &conn).await?;
    let Some(slots) = slots else {
        let _ = cursor.send(windows);
        return Ok(None);
    };
    if plan.dry_run {
        let _ = cursor.send(windows);
        return Ok(Some((conn, Fetched::Planned(slots))));
    }
    let t = Instant::now();
    let hook = plan.before_payload.clone();
    let snap = snapshot::read_chunk(
        &mut conn.conn,
        &conn.stmts,
        schema_id,
        &slots,
        move |selected| {
            // The next batch's read goes on once this one has read its slots in its snapshot, so
            // batches reach that point (and the test hook) in order.
            let _ = cursor.send(windows);
            // The ids are gathered only for a test hook.
            let call = hook.map(|h| (h, selected.iter().map(|s| s.row_id).collect()));
            async move {
                if let Some((h, ids)) = call {
                    h(schema_id, ids).await;
                }
            }
        },
    )
    .await?;
    step_done("select and read snapshot", t);
    Ok(Some((conn, Fetched::Read(snap))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn a_window_holds_its_batches_up_to_a_bound_but_never_less_than_one_batch() {
        assert_eq!(window_rows(10_000, 20), 200_000);
        assert_eq!(window_rows(7, 2), 14);
        assert_eq!(window_rows(40, 0), 40);
        assert_eq!(window_rows(100_000, 20), 200_000);
        assert_eq!(window_rows(500_000, 20), 500_000);
    }

    #[test]
    fn a_window_is_cut_in_row_id_order() {
        let slot = |n: u128, v: i64| Selected {
            row_id: Uuid::from_u128(n),
            changed_at: v,
            tid: Default::default(),
        };
        let window = vec![slot(5, 1), slot(2, 2), slot(9, 3), slot(1, 4), slot(7, 5)];
        let cut: Vec<Vec<u128>> = cut(window, 2)
            .into_iter()
            .map(|b| b.iter().map(|s| s.row_id.as_u128()).collect())
            .collect();
        assert_eq!(cut, [vec![1, 2], vec![5, 7], vec![9]]);
    }
}
