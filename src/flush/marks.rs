//! The mark step (step 5) of a drain, for a schema's `change_log` slots and a table source's
//! touches alike: each committed batch's mark runs on a connection of its own while the next
//! batches are exported, up to [`MARKS_IN_FLIGHT`] at once (docs/design.md §4.1, "The drain").

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use super::{SchemaReport, step_done};
use crate::error::{Error, Result};
use crate::source::snapshot;

/// A mark running on its own connection: the rows it marked.
type PendingMark = tokio::task::JoinHandle<Result<u64>>;

/// Marks in flight at once, each on a connection of its own. A batch's mark costs PostgreSQL
/// about as long as the next batch's export costs lakecdc; with one mark in flight the drain
/// waited for every mark. A schema's marks take their slots' locks in row-id order, as the
/// application's batch writers do, so two of them cannot deadlock with each other or with a
/// writer; a table source's delete disjoint touches of an append-only log that nothing else
/// locks.
pub(super) const MARKS_IN_FLIGHT: usize = 2;

/// A connection marks run on.
pub(super) trait MarkConnection: Send + Sync + 'static {
    /// Whether its session has ended (a mark that failed with it, a terminated backend): a
    /// mark would fail on it.
    fn is_closed(&self) -> bool;
}

impl MarkConnection for tokio_postgres::Client {
    fn is_closed(&self) -> bool {
        tokio_postgres::Client::is_closed(self)
    }
}

impl MarkConnection for snapshot::Marker {
    fn is_closed(&self) -> bool {
        snapshot::Marker::is_closed(self)
    }
}

/// The marks of one drain: their connections (`C`), opened as marks need them, and the marks
/// in flight, oldest first, each with the connection it runs on.
pub(super) struct Marks<C> {
    /// `None` where a mark failed: the failure may have ended the session before the client
    /// noticed, so the next mark there opens it anew.
    conns: Vec<Option<Arc<C>>>,
    /// Each with its connection and the rows it was given.
    pending: VecDeque<(usize, u64, PendingMark)>,
    /// True once a further connection was refused: the marks take turns on those open.
    refused: bool,
}

impl<C> Default for Marks<C> {
    fn default() -> Self {
        Self {
            conns: Vec::new(),
            pending: VecDeque::new(),
            refused: false,
        }
    }
}

impl<C: MarkConnection> Marks<C> {
    /// The first mark connection, opened with `open` if none is yet (a table source reserves
    /// its versions on it before the first publish).
    pub(super) async fn first<O>(&mut self, open: impl Fn() -> O) -> Result<Arc<C>>
    where
        O: Future<Output = Result<C>>,
    {
        if self.conns.is_empty() {
            self.conns.push(None);
        }
        self.ready(0, &open).await
    }

    /// Connection `at`, opened anew with `open` if its session has ended or its last mark
    /// failed.
    async fn ready<O>(&mut self, at: usize, open: &impl Fn() -> O) -> Result<Arc<C>>
    where
        O: Future<Output = Result<C>>,
    {
        if let Some(Some(c)) = self.conns.get(at)
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let c = Arc::new(open().await?);
        if let Some(slot) = self.conns.get_mut(at) {
            *slot = Some(c.clone());
        }
        Ok(c)
    }

    /// Starts `mark` (of the batch's `rows` rows) on a free connection: marks already finished are
    /// accounted for; with every connection busy a further one is opened with `open` (at most
    /// [`MARKS_IN_FLIGHT`]), or else the oldest mark is waited for. A further connection the
    /// server refuses (a connection limit) is not an error: it is not asked for again, and the
    /// marks take turns on those open. An older mark that failed fails the run, but only once
    /// this one has started: its batch is committed, and unmarked its rows would go out again
    /// (the failed mark's connection is opened anew for it: the failure may have ended its
    /// session).
    pub(super) async fn start<O, M, F>(
        &mut self,
        schema_id: i16,
        open: impl Fn() -> O,
        rows: u64,
        mark: M,
        report: &mut SchemaReport,
    ) -> Result<()>
    where
        O: Future<Output = Result<C>>,
        M: FnOnce(Arc<C>) -> F,
        F: Future<Output = Result<u64>> + Send + 'static,
    {
        let mut older = Ok(());
        while self
            .pending
            .front()
            .is_some_and(|(_, _, m)| m.is_finished())
        {
            older = older.and(self.settle_oldest(report).await);
        }
        if self.pending.len() >= self.conns.len()
            && self.conns.len() < MARKS_IN_FLIGHT
            && !self.refused
        {
            match open().await {
                Ok(c) => self.conns.push(Some(Arc::new(c))),
                Err(e) if !self.conns.is_empty() => {
                    self.refused = true;
                    tracing::warn!(
                        schema_id,
                        error = %e,
                        "a second mark connection could not be opened: the marks take turns on one"
                    );
                }
                Err(e) => return older.and(Err(e)),
            }
        }
        while self.pending.len() >= self.conns.len() && !self.pending.is_empty() {
            older = older.and(self.settle_oldest(report).await);
        }
        let mut free = Err(Error::Invariant("a mark without a free connection".into()));
        for at in 0..self.conns.len() {
            if self.pending.iter().any(|(j, _, _)| *j == at) {
                continue;
            }
            free = self.ready(at, &open).await.map(|c| (at, c));
            if free.is_ok() {
                break;
            }
        }
        let (at, conn) = match free {
            Ok(found) => found,
            Err(e) => return older.and(Err(e)),
        };
        let marking = mark(conn);
        self.pending.push_back((
            at,
            rows,
            tokio::spawn(async move {
                let t = Instant::now();
                let marked = marking.await?;
                step_done("mark", t);
                Ok(marked)
            }),
        ));
        older
    }

    /// Waits for the oldest mark in flight and accounts for it: the rows it marked, and those
    /// it left dirty (all of them when it failed: a mark is one statement). The mark leaves
    /// the queue only once it has settled.
    async fn settle_oldest(&mut self, report: &mut SchemaReport) -> Result<()> {
        let Some((at, given, task)) = self.pending.front_mut() else {
            return Ok(());
        };
        let (at, given) = (*at, *given);
        let settled = task.await.map_err(Error::task("mark")).and_then(|m| m);
        self.pending.pop_front();
        let marked = match &settled {
            Ok(marked) => *marked,
            Err(_) => {
                if let Some(slot) = self.conns.get_mut(at) {
                    *slot = None;
                }
                0
            }
        };
        report.rows_marked += marked;
        report.rows_left_dirty += given.saturating_sub(marked);
        settled.map(drop)
    }

    /// Waits for every mark in flight, all of them even when one fails (a started mark always
    /// finishes and is accounted for); the first failure is returned.
    pub(super) async fn settle(&mut self, report: &mut SchemaReport) -> Result<()> {
        let mut result = Ok(());
        while !self.pending.is_empty() {
            let settled = self.settle_oldest(report).await;
            result = result.and(settled);
        }
        result
    }

    /// Settles every mark and closes the connections, so that the sessions of a heap pass
    /// that follows do not come on top of them (docs/operations.md, sizing).
    pub(super) async fn close(&mut self, report: &mut SchemaReport) -> Result<()> {
        let settled = self.settle(report).await;
        self.conns.clear();
        settled
    }
}
