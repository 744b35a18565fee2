//! Flush of a table source (docs/design.md §9.2): the same per-batch steps as a schema's —
//! read, write the local file, stage, commit, mark — over `lakecdc_touch` and the table.
//! One snapshot reads the source's pending touches folded per row, each live row joined to
//! its table row through the primary key in the same statement, a batch at a time through a
//! cursor in `row_id` order (the run's files have disjoint ranges); the versions it hands out
//! are reserved (the source's floor raised) before the first publish, and the mark deletes
//! exactly the touches each published batch was read from. A source truncated since its last
//! init, or with a column whose type changed, is refused until `init`.

use std::sync::Arc;
use std::time::Instant;

use uuid::Uuid;

use super::marks::Marks;
use super::{
    Context, FlushHooks, FlushOptions, Publisher, Publishing, SchemaReport, due, step_done,
    stopped, under_lock,
};
use crate::engine;
use crate::error::{Error, Result};
use crate::lake::{SourceGuard, footer};
use crate::report::FileReport;
use crate::source::registry::Registered;
use crate::source::snapshot;
use crate::source::table_source::{self, ReadKind, TableSource};

/// Flushes table source `reg` under its lock.
pub(super) async fn flush(
    ctx: &Context,
    opts: &FlushOptions,
    hooks: &FlushHooks,
    source: &SourceGuard,
    reg: &Registered,
) -> SchemaReport {
    let started = Instant::now();
    let mut report = SchemaReport::new(reg);
    if ctx.shutdown.is_requested() {
        stopped(&mut report, false);
        return report;
    }
    under_lock(
        ctx,
        reg,
        report,
        started,
        opts.dry_run,
        async |lock, report| {
            let p = Publisher {
                ctx,
                opts,
                hooks,
                source,
                schema_id: reg.id,
                lock,
            };
            flush_locked(&p, report).await
        },
    )
    .await
}

async fn flush_locked(p: &Publisher<'_>, report: &mut SchemaReport) -> Result<()> {
    let (ctx, opts) = (p.ctx, p.opts);
    let client = ctx.connector.connect().await?;
    snapshot::tune_for_lookups(&client).await?;
    let src = table_source::load(&client, &ctx.tables, p.schema_id).await?;
    let t = Instant::now();
    // Forced, only whether anything is pending matters (the read counts the rows): no count
    // of a large backlog.
    let dirty = if opts.force {
        table_source::any_touch(&client, &src).await?
    } else {
        table_source::dirty(&client, &src).await?
    };
    step_done("count touches", t);
    // Refused even with nothing pending: after a TRUNCATE (which records no touch) the lake still
    // shows the rows it removed.
    if let Err(e) = src.check_flushable() {
        report.dirty_rows = dirty.count;
        return Err(e);
    }
    if !due(opts, dirty, ctx.clock.now_ms(), report) {
        return Ok(());
    }
    let (store, layout) = (ctx.lake.store.as_ref(), &ctx.lake.layout);
    let mut publishing = Publishing::check(store, layout, p.schema_id, p.source).await?;
    if src.has_new_columns() && !opts.dry_run {
        // Recorded now, so a later type change of the new column is caught too.
        table_source::record(&client, &src, None).await?;
    }
    let started = Instant::now();
    let src = Arc::new(src);
    let client = Arc::new(client);
    report.dirty_rows = 0;
    // The marks' first connection, opened once a read has rows to mark, and a second one for
    // the pages' reads by key, once a backlog needs it — the marks' first, so under a
    // connection limit the reads share one (and the marks take turns on theirs).
    let mut marks = Marks::default();
    let mut second: Option<Arc<tokio_postgres::Client>> = None;
    // A backlog larger than one read holds is read again, in a new snapshot, once the first
    // read's rows are exported and marked: its touches are gone by then.
    loop {
        let t = Instant::now();
        let mut read = table_source::SnapshotRead::open(
            client.clone(),
            src.clone(),
            ReadKind::Flush {
                scan_memory: usize::try_from(opts.scan_memory).unwrap_or(usize::MAX),
                max_touches: opts.max_touches.max(1),
            },
        )
        .await?;
        step_done("read touches", t);
        report.dirty_rows = report.dirty_rows.saturating_add(read.pending_rows());
        if read.needs_init_at.is_some() {
            // Truncated since the source was loaded: the snapshot would export the touched
            // rows as gone and leave every other truncated row live.
            let closed = read.close().await;
            return src.refuse_truncated().and(closed);
        }
        if !opts.dry_run && read.pending_rows() > 0 {
            marks.first(|| tuned_connection(&ctx.connector)).await?;
        }
        // More than one page read by key or range: two connections in the read's snapshot
        // read pages at once (docs/design.md §9.2); without a second connection (a
        // connection limit) the pages take turns on the first.
        if read.takes_connections() && read.pending_rows() > opts.batch_size.max(1) {
            if second.is_none() {
                second = tuned_connection(&ctx.connector)
                    .await
                    .map(Arc::new)
                    .inspect_err(|e| {
                        tracing::warn!(error = %e, "a second read connection could not be opened; reading on one");
                    })
                    .ok();
            }
            if let Some(c) = second.clone()
                && let Err(e) = read.add_connection(c).await
            {
                // The second connection's side failed (its transaction, its statements): it is
                // closed, the read goes on on one. A failure of the read's own connection fails
                // its next statement.
                tracing::warn!(error = %e, "a second read connection could not share the read's snapshot; reading on one");
                second = None;
            }
        }
        let reader = Arc::new(read);
        let result = drain(
            p,
            &src,
            &reader,
            &mut marks,
            &mut publishing,
            started,
            report,
        )
        .await;
        publishing.copied().await;
        // Read-only: closing (or dropping the connection on an error) leaves what was not
        // marked pending.
        let closed = reader.close().await;
        result.and(closed)?;
        let cut_short = report.reason.is_some() || ctx.shutdown.is_requested();
        if !reader.more || cut_short {
            break;
        }
        if opts.dry_run {
            // Nothing was marked: a new read would plan the same rows again.
            report.reason = Some(format!(
                "more than {} touches are pending: a run reads them {} at a time",
                opts.max_touches, opts.max_touches
            ));
            break;
        }
    }
    Ok(())
}

/// Exports the read batch by batch: the next batches are read (as many at once as the read has
/// connections, [`table_source::SnapshotRead::parallel_pages`]) while the current one is
/// written and published; each mark runs on a connection of its own while the next batches
/// are exported ([`Marks`]), and every mark has settled when the drain ends, inside the read's
/// transaction (which keeps the touches where they were read, [`table_source::mark`]).
/// Batches are taken, committed and marked in `row_id` order.
async fn drain(
    p: &Publisher<'_>,
    src: &Arc<TableSource>,
    reader: &Arc<table_source::SnapshotRead>,
    marks: &mut Marks<tokio_postgres::Client>,
    publishing: &mut Publishing,
    started: Instant,
    report: &mut SchemaReport,
) -> Result<()> {
    let (ctx, opts) = (p.ctx, p.opts);
    let limit = usize::try_from(opts.batch_size.max(1)).unwrap_or(usize::MAX);
    // Taken here, in order; read in a task.
    let read = || -> Result<Guarded> {
        let (reader, page) = (reader.clone(), reader.take(limit)?);
        Ok(Guarded(tokio::spawn(async move {
            let t = Instant::now();
            let batch = reader.read(page).await;
            step_done("read table batch", t);
            batch
        })))
    };
    let mut next = std::collections::VecDeque::new();
    let mut reserved = false;
    let result = async {
        for _ in 0..reader.parallel_pages().max(1) {
            next.push_back(read()?);
        }
        while let Some(reading) = next.pop_front() {
            if ctx.shutdown.is_requested() {
                stopped(report, false);
                break;
            }
            if opts.max_batches.is_some_and(|m| report.batches >= m)
                || started.elapsed() >= opts.time_budget
            {
                report.reason =
                    Some("batch or time budget reached; the rest is left for the next run".into());
                break;
            }
            let batch = reading.join().await?;
            let n = batch.versions.len();
            if n == 0 {
                break;
            }
            if n >= limit {
                next.push_back(read()?);
            }
            report.batches += 1;
            report.batches_by_range += u32::from(batch.by_range);
            report.rows_by_scan += batch.by_scan;
            report.table_scans += batch.scans;
            if batch.gone > 0 {
                tracing::warn!(
                    schema = %src.name,
                    rows = batch.gone,
                    "touched rows no longer in the table (written while detached, or truncated): exported as deleted"
                );
            }
            if opts.dry_run {
                report.files.push(FileReport {
                    path: String::new(),
                    rows: n as u64,
                    bytes: 0,
                });
                report.rows_exported += n as u64;
                continue;
            }
            let open = || tuned_connection(&ctx.connector);
            if !reserved {
                // The versions this read hands out are reserved before anything is published.
                reader.reserve(&*marks.first(open).await?).await?;
                reserved = true;
            }
            export(p, &batch, publishing, report).await?;
            let src = src.clone();
            let mark = move |m: Arc<tokio_postgres::Client>| async move {
                table_source::mark(&m, &src, &batch.touches).await
            };
            marks.start(p.schema_id, open, n as u64, mark, report).await?;
        }
        Ok(())
    }
    .await;
    // A started mark always finishes and is accounted for, whatever happened after it.
    let settled = marks.settle(report).await;
    result.and(settled)
}

/// A connection tuned for lookups by id and address (the marks', a second read's).
async fn tuned_connection(connector: &crate::source::Connector) -> Result<tokio_postgres::Client> {
    let c = connector.connect().await?;
    snapshot::tune_for_lookups(&c).await?;
    Ok(c)
}

/// A read-ahead task, aborted when dropped unjoined (its read is read-only: what it held stays
/// dirty).
struct Guarded(tokio::task::JoinHandle<Result<table_source::Batch>>);

impl Guarded {
    async fn join(mut self) -> Result<table_source::Batch> {
        (&mut self.0)
            .await
            .map_err(Error::task("read a table batch"))?
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Writes and publishes one batch (its mark follows).
async fn export(
    p: &Publisher<'_>,
    batch: &table_source::Batch,
    publishing: &mut Publishing,
    report: &mut SchemaReport,
) -> Result<()> {
    let local = p
        .opts
        .work_dir
        .join(format!("lakecdc-{}.parquet", Uuid::new_v4()));
    let t = Instant::now();
    let path = local.clone();
    let rows = batch.rows.clone();
    let expected = batch.versions.len() as u64;
    let written = tokio::task::spawn_blocking(move || {
        let n = engine::write_lake_file(&path, std::slice::from_ref(&rows))?;
        let info = footer::check_file(&path)?;
        if u64::try_from(info.row_count).ok() != Some(n) || n != expected {
            return Err(Error::Invariant(format!(
                "export wrote {n} rows ({} in the footer) for {expected} slots",
                info.row_count
            )));
        }
        Ok(super::Written {
            rows: n,
            columns: info.columns.into_iter().collect(),
        })
    })
    .await
    .map_err(Error::task("export"))
    .and_then(|w| w);
    step_done("write parquet", t);
    let outcome = match written {
        Ok(written) => {
            p.publish(&batch.versions, &local, written, publishing, report)
                .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = tokio::fs::remove_file(&local).await {
        tracing::warn!(path = %local.display(), error = %e, "could not remove local parquet file");
    }
    outcome
}
