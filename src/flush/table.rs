//! Flush of a table source (docs/design.md §9.2): the same per-batch steps as a schema's —
//! read, write the local file, stage, commit, mark — over `lakecdc_touch` and the table.
//! A batch is the oldest `batch_size` dirty slots after a keyset cursor, each live one joined
//! to its row through the primary key in the same statement, so the file holds exactly the
//! versions selected; the mark sets `flushed_at` only where the version is still the one
//! exported. A source truncated since its last init, or with a column whose type changed,
//! is refused until `init`.

use std::sync::Arc;
use std::time::Instant;

use uuid::Uuid;

use super::{
    PendingMark, Publisher, SchemaReport, due, next_flushed_at, settle_mark, step_done, stopped,
    under_lock,
};
use crate::engine;
use crate::error::{Error, Result};
use crate::lake::{footer, owner};
use crate::report::FileReport;
use crate::source::registry::Registered;
use crate::source::snapshot;
use crate::source::table_source;

/// Flushes table source `reg` under its lock.
pub(super) async fn flush(p: &Publisher<'_>, reg: &Registered) -> SchemaReport {
    let started = Instant::now();
    let mut report = SchemaReport::new(reg);
    if p.ctx.shutdown.is_requested() {
        stopped(&mut report, false);
        return report;
    }
    under_lock(p.ctx, reg, report, started, async |report| {
        flush_locked(p, report).await
    })
    .await
}

async fn flush_locked(p: &Publisher<'_>, report: &mut SchemaReport) -> Result<()> {
    let (ctx, opts) = (p.ctx, p.opts);
    let client = ctx.connector.connect().await?;
    snapshot::tune_for_lookups(&client).await?;
    let src = table_source::load(&client, &ctx.tables, p.schema_id).await?;
    let dirty = table_source::dirty(&client, &src).await?;
    // Refused even with nothing dirty: after a TRUNCATE (which records no slot) the lake still
    // shows the rows it removed.
    if let Err(e) = src.check_flushable() {
        report.dirty_rows = dirty.count;
        return Err(e);
    }
    if !due(opts, dirty, ctx.clock.now_ms(), report) {
        return Ok(());
    }
    let (store, layout) = (ctx.lake.store.as_ref(), &ctx.lake.layout);
    owner::check_source(store, layout, p.schema_id, p.source).await?;
    let mut ownership = owner::check_writable(store, layout, p.schema_id).await?;
    if src.has_new_columns() && !opts.dry_run {
        // Recorded now, so a later type change of the new column is caught too.
        table_source::record(&client, &src, None).await?;
    }
    let started = Instant::now();
    let src = Arc::new(src);
    let reader = Arc::new(client);
    let limit = opts.batch_size;
    // The next batch is read on the first connection while the current one is written and
    // published; each mark runs on a second connection while the next batch is exported (at
    // most one in flight). Batches are still committed and marked in selection order.
    let read = |cursor| {
        let (reader, src) = (reader.clone(), src.clone());
        Guarded(tokio::spawn(async move {
            let t = Instant::now();
            let batch = table_source::read_batch(&reader, &src, cursor, limit).await;
            step_done("read table batch", t);
            batch
        }))
    };
    let mut next = Some(read(None));
    let mut marker: Option<Arc<tokio_postgres::Client>> = None;
    let mut pending: Option<PendingMark> = None;
    let result = async {
        while let Some(reading) = next.take() {
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
            if n >= usize::try_from(limit).unwrap_or(usize::MAX) {
                next = Some(read(batch.next));
            }
            report.batches += 1;
            if batch.gone > 0 {
                tracing::warn!(
                    schema = %src.name,
                    rows = batch.gone,
                    "dirty rows no longer in the table (written while detached, or truncated): exported as deleted"
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
            export(p, &batch, &mut ownership, report).await?;
            settle_mark(pending.take(), report).await?;
            let m = match &marker {
                Some(m) => m.clone(),
                None => {
                    let c = ctx.connector.connect().await?;
                    snapshot::tune_for_lookups(&c).await?;
                    marker.insert(Arc::new(c)).clone()
                }
            };
            let flushed_at = next_flushed_at(ctx.clock.now_ms());
            let src = src.clone();
            pending = Some(tokio::spawn(async move {
                let t = Instant::now();
                let marked = table_source::mark(&m, &src, flushed_at, &batch.versions).await?;
                step_done("mark", t);
                Ok((marked, batch.versions.len() as u64))
            }));
        }
        Ok(())
    }
    .await;
    // A started mark always finishes and is accounted for, whatever happened after it.
    let settled = settle_mark(pending.take(), report).await;
    result.and(settled)
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
    ownership: &mut owner::Ownership,
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
            p.publish(&batch.versions, &local, written, ownership, report)
                .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = tokio::fs::remove_file(&local).await {
        tracing::warn!(path = %local.display(), error = %e, "could not remove local parquet file");
    }
    outcome
}
