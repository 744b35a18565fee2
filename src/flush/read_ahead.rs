//! Batch reads running ahead of the export, on up to two connections. A batch's selection
//! fixes where the next one starts, so batch k+1 is selected (on the other connection, in
//! its own repeatable-read snapshot) while batch k's entity and EAV rows are still being
//! read: PostgreSQL serves two reads at once and the drain seldom waits for one. Batches
//! come out in selection order; reads still in flight when the drain stops are aborted
//! (they write nothing). When the second connection cannot be opened (a connection limit),
//! the reads take turns on the first.

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
    /// Select only; read no snapshot.
    pub dry_run: bool,
    /// Read no more batches than this (`--max-batches`).
    pub max_batches: Option<u32>,
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

/// Sends the last slot of a full selection (where the next batch starts), or `None` when the
/// selection was the last.
type Cursor = oneshot::Sender<Option<Selected>>;

type Read = JoinHandle<Result<Option<(Conn, Fetched)>>>;

/// The batch reads in flight, oldest first.
pub(super) struct ReadAhead {
    plan: Arc<Plan>,
    pool: Arc<Pool>,
    reads: VecDeque<Read>,
    /// Reads started so far.
    started: u32,
    /// Where the batch after the newest read starts, once that read's selection is known.
    newest: Option<oneshot::Receiver<Option<Selected>>>,
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
    fn spawn(&mut self, previous: Option<oneshot::Receiver<Option<Selected>>>, cursor: Cursor) {
        if self.plan.max_batches.is_some_and(|m| self.started >= m) {
            return;
        }
        let (plan, pool) = (self.plan.clone(), self.pool.clone());
        self.started += 1;
        self.reads.push_back(tokio::spawn(async move {
            let after = match previous {
                None => None,
                Some(rx) => match rx.await {
                    Ok(Some(last)) => Some(last),
                    // The batch before was the last, or failed (its own read reports that).
                    Ok(None) | Err(_) => return Ok(None),
                },
            };
            let conn = pool.acquire(&plan).await;
            read(&plan, conn, after, cursor).await
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

/// Where the batch after `selected` starts: its last slot when the selection is full.
fn next_start(selected: &[Selected], limit: i64) -> Option<Selected> {
    if i64::try_from(selected.len()).unwrap_or(i64::MAX) >= limit {
        selected.last().copied()
    } else {
        None
    }
}

/// Steps 1 and 2 for the batch after `after`: selection and payload in one snapshot (in a
/// dry run only the selection); `None` when no slot is left. The selection's end goes to
/// `cursor` as soon as it is known.
async fn read(
    plan: &Plan,
    mut conn: Conn,
    after: Option<Selected>,
    cursor: Cursor,
) -> Result<Option<(Conn, Fetched)>> {
    let (schema_id, limit) = (plan.schema_id, plan.batch_size);
    let t = Instant::now();
    if plan.dry_run {
        let selected =
            snapshot::select(&conn.conn.client, &conn.stmts, schema_id, limit, after).await?;
        let _ = cursor.send(next_start(&selected, limit));
        step_done("select", t);
        return Ok((!selected.is_empty()).then(|| (conn, Fetched::Planned(selected))));
    }
    let hook = plan.before_payload.clone();
    let read = snapshot::read_next(
        &mut conn.conn,
        &conn.stmts,
        schema_id,
        limit,
        after,
        move |selected| {
            let _ = cursor.send(next_start(selected, limit));
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
    Ok(read.map(|snap| (conn, Fetched::Read(snap))))
}
