//! Init of a table source (docs/design.md §9.2): every row of the table, read in ONE snapshot
//! through a cursor in `row_id` order (the key's own order for a uuid or integer key; a sort
//! for a hashed one), all with one version above every version the source exported before
//! (reserved before the save, docs/design.md §9.2), cut into base files with disjoint ranges, uploaded, and listed in one save that
//! replaces the base tier and the inventoried deltas. After the save the source's columns are
//! recorded as exported and its truncate mark cleared — unless a `TRUNCATE` came after the
//! snapshot, which keeps it.

use std::collections::BTreeSet;

use arrow::record_batch::RecordBatch;
use uuid::Uuid;

use super::{
    FileReport, InitOptions, SchemaInit, base_entry, delete_unlisted, publish, rows_per_file,
};
use crate::engine;
use crate::error::{Error, Result};
use crate::job::Context;
use crate::lake::manifest::FileEntry;
use crate::lake::{SourceGuard, footer, owner};
use crate::source::lock::SchemaLock;
use crate::source::table_source::{self, ReadKind, SnapshotRead, TableSource};

/// A file is also cut once its staged rows hold this much Arrow memory.
const STAGED_BYTES: usize = 96 * 1024 * 1024;

/// Exports table source `lock.schema_id()` and publishes it (or, dry, counts it).
pub(super) async fn export(
    ctx: &Context,
    opts: &InitOptions,
    source: &SourceGuard,
    lock: &SchemaLock,
    ownership: owner::Ownership,
    deltas: &BTreeSet<String>,
    out: &mut SchemaInit,
) -> Result<()> {
    let client = ctx.connector.connect().await?;
    let src =
        std::sync::Arc::new(table_source::load(&client, &ctx.tables, lock.schema_id()).await?);
    let read = SnapshotRead::open(std::sync::Arc::new(client), src.clone(), ReadKind::Init).await?;
    if opts.dry_run {
        out.live_rows = read.rows;
        let per_file = opts.max_file_rows.max(1);
        let rows = u64::try_from(read.rows).unwrap_or(0);
        out.estimated_files = rows.div_ceil(per_file).max(1);
        return read.close().await;
    }
    let seen = read.needs_init_at;
    let expected = u64::try_from(read.rows).unwrap_or(0);
    let mut keys = Vec::new();
    // A second connection: the read's is read-only.
    let writer = match ctx.connector.connect().await {
        Ok(w) => w,
        Err(e) => {
            let _ = read.close().await;
            return Err(e);
        }
    };
    let written = match read.reserve(&writer).await {
        Ok(()) => write_files(ctx, opts, &src, &read, expected, &mut keys, out).await,
        Err(e) => Err(e),
    };
    let closed = read.close().await;
    let entries = match written.and_then(|e| closed.map(|()| e)) {
        Ok(e) => e,
        Err(e) => {
            delete_unlisted(ctx, &keys).await;
            out.forget_files();
            return Err(e);
        }
    };
    publish(ctx, source, lock, ownership, deltas, entries, out).await?;
    // The lake now holds the table as the snapshot saw it, with today's column types.
    table_source::record(&writer, &src, Some(seen)).await
}

/// Reads every page and writes and uploads a base file per `max_file_rows` rows (or
/// [`STAGED_BYTES`]); `keys` collects every key an upload was started for.
async fn write_files(
    ctx: &Context,
    opts: &InitOptions,
    src: &TableSource,
    read: &SnapshotRead,
    expected: u64,
    keys: &mut Vec<String>,
    out: &mut SchemaInit,
) -> Result<Vec<FileEntry>> {
    let page_rows = usize::try_from(opts.page_rows.max(1)).unwrap_or(50_000);
    let file_rows = rows_per_file(opts, 1) as usize;
    let mut entries = Vec::new();
    let mut staged: Vec<RecordBatch> = Vec::new();
    loop {
        if ctx.shutdown.is_requested() {
            return Err(Error::Stopped);
        }
        // A page never takes a file past its row count.
        let staged_rows: usize = staged.iter().map(RecordBatch::num_rows).sum();
        let page = read
            .page(page_rows.min(file_rows.saturating_sub(staged_rows).max(1)))
            .await?
            .rows;
        let end = page.num_rows() == 0;
        if !end {
            staged.push(page);
        }
        let rows: usize = staged.iter().map(RecordBatch::num_rows).sum();
        let bytes: usize = staged.iter().map(RecordBatch::get_array_memory_size).sum();
        if (end && rows > 0) || rows >= file_rows || bytes >= STAGED_BYTES {
            let batches = std::mem::take(&mut staged);
            entries.push(upload(ctx, opts, src, batches, keys, out).await?);
            if let Some(progress) = &opts.progress {
                progress(src.id, out.rows, expected.max(out.rows));
            }
        }
        if end {
            break;
        }
    }
    if entries.is_empty() {
        // No row at all: one zero-row base, so the lake says the table is empty.
        let empty = table_source::empty_rows(src)?;
        entries.push(upload(ctx, opts, src, vec![empty], keys, out).await?);
    }
    Ok(entries)
}

/// Writes `batches` (in `row_id` order) as one base file and uploads it to its final key (a
/// base needs no staging key: nothing lists it until the save, and gc knows an unlisted init
/// base for an orphan).
async fn upload(
    ctx: &Context,
    opts: &InitOptions,
    src: &TableSource,
    batches: Vec<RecordBatch>,
    keys: &mut Vec<String>,
    out: &mut SchemaInit,
) -> Result<FileEntry> {
    let range = table_source::row_id_range(&batches)?;
    let layout = &ctx.lake.layout;
    let key = match range {
        Some((first, last)) => layout.init_base_key(src.id, first, last, Uuid::now_v7()),
        None => layout.merged_base_key(src.id, Uuid::now_v7()),
    };
    let local = opts
        .work_dir
        .join(format!("lakecdc-{}.parquet", Uuid::new_v4()));
    let path = local.clone();
    let written = tokio::task::spawn_blocking(move || {
        let rows = engine::write_lake_file(&path, &batches)?;
        let info = footer::check_file(&path)?;
        if u64::try_from(info.row_count).ok() != Some(rows) {
            return Err(Error::Invariant(format!(
                "init wrote {rows} rows, the footer says {}",
                info.row_count
            )));
        }
        Ok((rows, info.columns))
    })
    .await
    .map_err(Error::task("write a base file"))
    .and_then(|r| r);
    let (rows, columns) = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = tokio::fs::remove_file(&local).await;
            return Err(e);
        }
    };
    keys.push(key.clone());
    let put = ctx.lake.store.put_file(&key, &local).await;
    let _ = tokio::fs::remove_file(&local).await;
    let put = put.map_err(Error::storage("upload base", key.clone()))?;
    let now = ctx.clock.now_ms();
    let (min, max) = range
        .map(|(first, last)| (first.to_string(), last.to_string()))
        .unwrap_or_default();
    out.rows += rows;
    out.bytes += put.size;
    out.files.push(FileReport {
        path: key.clone(),
        rows,
        bytes: put.size,
    });
    tracing::info!(schema = %src.name, key = %key, rows, bytes = put.size, "base file uploaded");
    Ok(base_entry(
        key,
        (min, max),
        rows,
        &put,
        columns.into_iter().collect(),
        now,
    ))
}
