//! `lakecdc init`: exports every live entity of a schema as base files (docs/design.md §4.2) and makes
//! them the whole base tier in one conditional manifest save.
//!
//! Per schema, under its advisory lock (contended → reported for that schema, others go on). A
//! manifest that lists deltas is refused unless `--replace-delta`. Live rows are read in keyset
//! pages on `ltbase_row_id` (never OFFSET) with their EAV rows, every reader's every page in ONE
//! exported snapshot (so the base tier is the source at one instant), read with binary COPY
//! decoded straight into Arrow; pages are staged (held as Arrow)
//! until a file holds about `--target-file-size` (the rows-per-file estimate corrects itself from
//! each written file; at most `--max-file-rows` and 96 MiB of staged rows; one file is staged per
//! reader). A file's pages are joined with their EAV values in Rust when that gives the pivot's
//! rows exactly (nearly always: [`crate::engine::assemble`]) and written by
//! [`crate::engine::writer`] in row order; otherwise DuckDB joins, pivots and sorts them. Two files are written at once, each
//! by its own engine, and each is checksummed while it uploads straight to its write-once key
//! `{min}_{max}_{uuid}.parquet`. `--readers` connections (2) read disjoint row-id ranges at once,
//! and a file holds one reader's consecutive pages, so base files never overlap in row-id range;
//! reading the next file's pages, writing files and uploading them overlap. Publishing replaces the
//! base tier (and with `--replace-delta` the delta tier) in ONE save; the superseded files, bases
//! and replaced deltas alike, are recorded as retired and left to gc, which deletes them past its
//! grace. A schema with no live rows publishes one zero-row base. Writes during init reach the lake
//! with the next flush: a base row carries `changed_at = ltbase_updated_at`, exactly what flush
//! writes for the same version (docs/hazards.md #210).

use std::collections::{BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::Instant;

use arrow::record_batch::RecordBatch;
use serde::Serialize;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::config;
use crate::engine::Driver;
use crate::engine::export::Inputs;
use crate::engine::{Engine, EngineConfig};
use crate::error::{Error, Result};
use crate::job;
use crate::job::Context;
use crate::lake::footer;
use crate::lake::manifest::{self, CommitPolicy, FileEntry, SaveFrom, Tier};
use crate::lake::{SourceGuard, owner};
pub use crate::report::FileReport;
use crate::report::label;
use crate::schema::{SchemaDef, ValueType, dir};
pub use crate::source::heap_read::ReadOrder;
use crate::source::heap_read::{self, HeapPlan};
use crate::source::live::{self, IdRange, LivePage};
use crate::source::lock::SchemaLock;
use crate::source::registry::{Kind, Registered};
use crate::store::delete_or_leave;

mod table;

/// A test seam called by the reader after each page is handed over, with the page's last row
/// id (the next page's cursor).
pub type PageHook =
    std::sync::Arc<dyn Fn(Uuid) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// Called as rows are staged: (schema id, rows done, live rows expected: the planner's estimate,
/// above the rows done while reading), and once more when reading ends with both equal. The
/// binary draws a progress bar with it on a terminal.
pub type ProgressFn = std::sync::Arc<dyn Fn(i16, u64, u64) + Send + Sync>;

/// Init options (defaults as in docs/design.md §4.2).
#[derive(Clone)]
pub struct InitOptions {
    /// Schema names or ids; empty = every registered schema.
    pub schemas: Vec<String>,
    /// Replace a delta tier instead of refusing.
    pub replace_delta: bool,
    /// Aimed-for size of each base file.
    pub target_file_size: u64,
    /// Most rows in one file (bounds the rows staged in memory at once).
    pub max_file_rows: u64,
    /// Rows per keyset page.
    pub page_rows: i64,
    /// Connections reading disjoint row-id ranges (or heap ranges) at once.
    pub readers: u32,
    /// Row-id order (keyset pages) or heap order (row-id buckets); `Auto` picks by the row
    /// ids' correlation with the heap's order.
    pub read_order: ReadOrder,
    /// Count and estimate only.
    pub dry_run: bool,
    /// Local Parquet files and DuckDB spill files.
    pub work_dir: PathBuf,
    /// Measures the work dir's free space before a heap-order read spills to it
    /// ([`job::available_bytes`] by default); `None` leaves it unmeasured.
    pub free_space: Option<job::FreeSpace>,
    /// DuckDB settings.
    pub engine: EngineConfig,
    /// Test seam between pages (the `testing` feature only: docs/security.md).
    #[cfg(any(test, feature = "testing"))]
    pub after_page: Option<PageHook>,
    /// Progress reporting; `None` logs a line per file only.
    pub progress: Option<ProgressFn>,
}

impl std::fmt::Debug for InitOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitOptions")
            .field("schemas", &self.schemas)
            .field("replace_delta", &self.replace_delta)
            .field("target_file_size", &self.target_file_size)
            .field("max_file_rows", &self.max_file_rows)
            .field("page_rows", &self.page_rows)
            .field("read_order", &self.read_order)
            .field("dry_run", &self.dry_run)
            .finish_non_exhaustive()
    }
}

impl InitOptions {
    /// The page hook: only builds with the `testing` feature have one.
    fn page_hook(&self) -> Option<PageHook> {
        #[cfg(any(test, feature = "testing"))]
        return self.after_page.clone();
        #[cfg(not(any(test, feature = "testing")))]
        None
    }
}

impl Default for InitOptions {
    fn default() -> Self {
        Self {
            schemas: Vec::new(),
            replace_delta: false,
            target_file_size: 256 * 1024 * 1024,
            max_file_rows: 200_000,
            page_rows: 50_000,
            readers: 2,
            read_order: ReadOrder::Auto,
            dry_run: false,
            work_dir: std::env::temp_dir(),
            free_space: Some(job::available_bytes),
            engine: EngineConfig::default(),
            #[cfg(any(test, feature = "testing"))]
            after_page: None,
            progress: None,
        }
    }
}

/// Outcome for one schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The base tier was replaced (or, in a dry run, estimated).
    Exported,
    /// Another process holds the schema lock; the schema was not exported.
    Locked,
    /// The manifest lists deltas and `--replace-delta` was not given.
    Refused,
    /// The export failed; nothing was published.
    Failed,
    /// A stop (SIGTERM/SIGINT) came before the schema's base was published; nothing was
    /// published, and init can simply be run again.
    Stopped,
}

/// Report for one schema.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SchemaInit {
    /// Schema id.
    pub schema_id: i16,
    /// Schema name.
    pub schema: String,
    /// Outcome.
    pub outcome: Outcome,
    /// Why, for refused and failed.
    pub reason: Option<String>,
    /// Live rows: counted, in a dry run; exported, in a run (which counts none: its progress
    /// total is the planner's estimate).
    pub live_rows: i64,
    /// Rows exported.
    pub rows: u64,
    /// Files written (in a dry run: the estimate).
    pub files: Vec<FileReport>,
    /// Estimated files (dry run).
    pub estimated_files: u64,
    /// Bytes written (in a dry run: the estimate).
    pub bytes: u64,
    /// Delta files replaced (`--replace-delta`).
    pub replaced_deltas: usize,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// Rows per second.
    pub rows_per_s: f64,
    /// The live rows were read in heap order into row-id buckets (in a dry run: would be).
    pub heap_order: bool,
    /// Bytes a heap-order read spilled to scratch disk (the live rows' binary size; in a dry
    /// run, the estimate: the schema's share of the tables' bytes).
    pub scratch_bytes: u64,
}

impl SchemaInit {
    /// Drops the files of an init that published nothing (they were deleted).
    fn forget_files(&mut self) {
        self.files.clear();
        self.live_rows = 0;
        self.rows = 0;
        self.bytes = 0;
    }

    /// A schema's report before anything was done (outcome `Exported` until told otherwise).
    fn new(reg: &Registered) -> Self {
        Self {
            schema_id: reg.id,
            schema: reg.name.clone(),
            outcome: Outcome::Exported,
            reason: None,
            live_rows: 0,
            rows: 0,
            files: Vec::new(),
            estimated_files: 0,
            bytes: 0,
            replaced_deltas: 0,
            duration_ms: 0,
            rows_per_s: 0.0,
            heap_order: false,
            scratch_bytes: 0,
        }
    }
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InitReport {
    /// True for `--dry-run`.
    pub dry_run: bool,
    /// Per schema, by id.
    pub schemas: Vec<SchemaInit>,
}

impl InitReport {
    /// 0 done, 1 when a schema failed, was refused or was stopped, 3 when a schema was skipped
    /// because its lock was held (the others were exported).
    pub fn exit_code(&self) -> i32 {
        let has = |o| self.schemas.iter().any(|s| s.outcome == o);
        if has(Outcome::Failed) || has(Outcome::Refused) || has(Outcome::Stopped) {
            1
        } else if has(Outcome::Locked) {
            3
        } else {
            0
        }
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "{:<24} {:>6} {:<9} {:>10} {:>10} {:>6} {:>12} {:>9} {:>10}\n",
            "SCHEMA", "ID", "OUTCOME", "LIVE", "ROWS", "FILES", "BYTES", "MS", "ROWS/S"
        );
        for s in &self.schemas {
            let outcome = label(&s.outcome);
            let files = if self.dry_run {
                s.estimated_files
            } else {
                s.files.len() as u64
            };
            out.push_str(&format!(
                "{:<24} {:>6} {:<9} {:>10} {:>10} {:>6} {:>12} {:>9} {:>10.0}\n",
                s.schema,
                s.schema_id,
                outcome,
                s.live_rows,
                s.rows,
                files,
                s.bytes,
                s.duration_ms,
                s.rows_per_s
            ));
            if s.heap_order {
                out.push_str(&format!(
                    "    read in heap order into row-id buckets; {}{} bytes of scratch disk\n",
                    if self.dry_run { "about " } else { "" },
                    s.scratch_bytes
                ));
            }
            if let Some(r) = &s.reason {
                out.push_str(&format!("    {}\n", crate::report::printable(r, false)));
            }
        }
        if self.dry_run {
            out.push_str(
                "dry run: nothing was written (files are estimates; bytes an upper bound: the rows' uncompressed size)\n",
            );
        }
        out
    }
}

/// The row-width estimate used before any file has been written (docs/design.md §4.2).
pub fn estimated_row_bytes(def: &SchemaDef) -> u64 {
    50 + def
        .attributes
        .iter()
        .map(|a| match a.value_type {
            ValueType::Text => 100,
            ValueType::Numeric | ValueType::Bigint | ValueType::Integer => 8,
            ValueType::Smallint => 2,
            ValueType::Bool => 1,
            ValueType::Date | ValueType::Datetime => 8,
            ValueType::Uuid => 16,
            ValueType::List => 200,
        })
        .sum::<u64>()
}

/// Rows for the next file: the target size over the bytes per row, at least 1,000 and at most
/// `max_file_rows`.
fn rows_per_file(opts: &InitOptions, bytes_per_row: u64) -> u64 {
    let max = opts.max_file_rows.max(1);
    (opts.target_file_size / bytes_per_row.max(1)).clamp(1_000.min(max), max)
}

/// Exports the selected schemas.
pub async fn run(ctx: &Context, opts: &InitOptions) -> Result<InitReport> {
    let (scratch, engine) = job::scratch(&opts.work_dir, &opts.engine)?;
    let opts = &InitOptions {
        work_dir: scratch.path().to_path_buf(),
        engine,
        ..opts.clone()
    };
    let targets = job::select_schemas(ctx, &opts.schemas).await?;
    // Pre-flight (docs/hazards.md #193): every schema's metadata resolves before any side effect.
    // A table source's columns come from the catalog (docs/design.md §9).
    let mut work = Vec::new();
    for reg in targets {
        let def = match reg.kind {
            Kind::Table => None,
            Kind::Schema => {
                let dir = ctx.schema_dir.as_deref().ok_or_else(|| {
                    Error::setting("schema-dir", "is needed by init (the attribute metadata)")
                })?;
                Some(dir::load(dir, &reg.name)?)
            }
        };
        work.push((reg, def));
    }
    let source = &job::source_guard(ctx).await?;
    let schemas = job::each_until_stopped(
        &ctx.shutdown,
        work,
        |(reg, _)| &reg.name,
        |(reg, def)| async move { init_schema(ctx, opts, source, &reg, def.as_ref()).await },
        |(reg, _)| {
            let mut s = SchemaInit::new(&reg);
            s.outcome = Outcome::Stopped;
            s.reason = Some("stop requested before this schema started; run init again".into());
            s
        },
    )
    .await;
    let report = InitReport {
        dry_run: opts.dry_run,
        schemas,
    };
    tracing::info!(
        schemas = report.schemas.len(),
        rows = report.schemas.iter().map(|s| s.rows).sum::<u64>(),
        exit_code = report.exit_code(),
        dry_run = opts.dry_run,
        "init done"
    );
    Ok(report)
}

async fn init_schema(
    ctx: &Context,
    opts: &InitOptions,
    source: &SourceGuard,
    reg: &Registered,
    def: Option<&SchemaDef>,
) -> SchemaInit {
    let started = Instant::now();
    let mut out = SchemaInit::new(reg);
    let result = job::with_lock_or_plan(ctx, reg.id, opts.dry_run, async |lock| {
        export_schema(ctx, opts, source, lock, def, &mut out).await
    })
    .await;
    match result {
        Ok(Some(())) => {}
        Ok(None) => {
            out.outcome = Outcome::Locked;
            out.reason = Some("another process holds the schema lock; run init again".into());
        }
        Err(Error::Stopped) => {
            out.outcome = Outcome::Stopped;
            out.reason = Some("stop requested during the export; nothing was published (what was uploaded is deleted); run init again".into());
        }
        Err(e) => {
            out.outcome = Outcome::Failed;
            out.reason = Some(job::failed("init", &reg.name, e.chain()));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    out.duration_ms = (secs * 1000.0) as u64;
    out.rows_per_s = if secs > 0.0 {
        out.rows as f64 / secs
    } else {
        0.0
    };
    out
}

async fn export_schema(
    ctx: &Context,
    opts: &InitOptions,
    source: &SourceGuard,
    lock: &SchemaLock,
    def: Option<&SchemaDef>,
    out: &mut SchemaInit,
) -> Result<()> {
    let schema_id = lock.schema_id();
    let store = ctx.lake.store.as_ref();
    let layout = &ctx.lake.layout;
    let key = layout.manifest_key(schema_id);
    let loaded = manifest::load_within(store, &key, schema_id, layout.limits()).await?;
    // A lake written from another database is refused before anything is read or written.
    if let Some(l) = &loaded {
        source.check(&key, l.manifest.source.as_ref())?;
    }
    // The commit retires every listed base and the inventoried deltas: each must be a data file
    // of this schema (docs/hazards.md S1).
    let foreign = loaded.as_ref().and_then(|l| {
        l.manifest
            .files
            .iter()
            .find_map(|f| layout.check_listed(schema_id, &f.path).err())
    });
    if let Some(foreign) = foreign {
        out.outcome = Outcome::Refused;
        out.reason = Some(foreign.refusal(&key, "replace it").to_string());
        return Ok(());
    }
    let deltas: BTreeSet<String> = loaded
        .as_ref()
        .map(|l| {
            l.manifest
                .tier(Tier::Delta)
                .map(|f| f.path.clone())
                .collect()
        })
        .unwrap_or_default();
    // gc deletes what this manifest does not list: the data prefix must be its own.
    let ownership = owner::check(store, layout, schema_id).await?;
    if let owner::Ownership::Other(why) = ownership {
        out.outcome = Outcome::Refused;
        out.reason = Some(why);
        return Ok(());
    }
    if !deltas.is_empty() && !opts.replace_delta {
        out.outcome = Outcome::Refused;
        out.reason = Some(format!(
            "manifest {key} lists {} delta files; compact them first, or run init --replace-delta to replace them with the new base",
            deltas.len()
        ));
        return Ok(());
    }
    let Some(def) = def else {
        return table::export(ctx, opts, source, lock, ownership, &deltas, out).await;
    };
    if opts.dry_run {
        let client = ctx.connector.connect().await?;
        // Each reader's id range ends in files of its own, as the run cuts them.
        let ranges = live::live_ranges(&client, &ctx.tables, schema_id, opts.readers).await?;
        let counts = live::count_live_in(&client, &ctx.tables, schema_id, &ranges).await?;
        out.live_rows = counts.iter().sum();
        let per_row = estimated_row_bytes(def);
        let per_file = rows_per_file(opts, per_row);
        let live = u64::try_from(out.live_rows).unwrap_or(0);
        out.estimated_files = (counts.iter())
            .map(|&n| u64::try_from(n).unwrap_or(0).div_ceil(per_file))
            .sum::<u64>()
            .max(1);
        if let Some(plan) = heap_plan(ctx, opts, &client, schema_id, def, live).await? {
            out.heap_order = true;
            // In heap order each row-id bucket is a file, whatever the readers.
            out.estimated_files = (plan.buckets() as u64).max(1);
            out.scratch_bytes = plan.scratch_estimate();
        }
        out.bytes = live * per_row;
        return Ok(());
    }
    let entries = export_files(ctx, opts, schema_id, def, out).await?;
    publish(ctx, source, lock, ownership, &deltas, entries, out).await
}

/// Lists `entries` as the whole base tier in one save, replacing every listed base and the
/// inventoried `deltas`; a save that certainly did not land deletes them.
async fn publish(
    ctx: &Context,
    source: &SourceGuard,
    lock: &SchemaLock,
    ownership: owner::Ownership,
    deltas: &BTreeSet<String>,
    entries: Vec<FileEntry>,
    out: &mut SchemaInit,
) -> Result<()> {
    let schema_id = lock.schema_id();
    let store = ctx.lake.store.as_ref();
    let layout = &ctx.lake.layout;
    let key = layout.manifest_key(schema_id);
    out.live_rows = i64::try_from(out.rows).unwrap_or(i64::MAX);
    // An export can run for hours: had the lock's session died meanwhile, gc could have taken
    // the lock and deleted bases uploaded long ago as orphans. Held now means held throughout
    // (the lock lives as long as its session). An unclaimed prefix is claimed now, at publish
    // time, so an export that fails or stops leaves no claim behind.
    let committed = async {
        lock.ensure_held().await?;
        owner::claim_and_commit(
            store,
            layout,
            schema_id,
            &out.schema,
            &ownership,
            source,
            ctx.clock.as_ref(),
            CommitPolicy::default(),
            SaveFrom::default(),
            |m| {
                // The whole base tier, and exactly the deltas inventoried at the start (what
                // `--replace-delta` agreed to replace; any other delta is newer than this
                // export's reads). They are recorded as retired, so gc gives readers of the
                // manifests that listed them the whole grace period.
                let replaced: BTreeSet<String> = m
                    .files
                    .iter()
                    .filter(|f| {
                        f.tier == Tier::Base || (f.tier == Tier::Delta && deltas.contains(&f.path))
                    })
                    .map(|f| f.path.clone())
                    .collect();
                // A compaction (it takes no lock) folded inventoried deltas into a new delta
                // while this init read: that delta repackages copies older than this export,
                // and kept beside the new bases they would outlive the tombstones of the
                // deltas replaced with them (docs/hazards.md L71). Nothing tells it from a
                // newer delta, so nothing is published; the next run inventories it.
                let vanished = deltas.iter().find(|p| !m.files.iter().any(|f| f.path == **p));
                let newcomer = m
                    .tier(Tier::Delta)
                    .find(|f| !deltas.contains(&f.path));
                if let (Some(gone), Some(new)) = (vanished, newcomer) {
                    return Err(Error::Manifest {
                        key: key.clone(),
                        message: format!(
                            "a compaction merged the deltas this init inventoried ({gone:?} among them) into {:?} while it read; that delta may hold copies older than this export, so nothing was published: pause compaction of this schema while init runs (init --replace-delta replaces the delta tier itself), then run it again",
                            new.path
                        ),
                    });
                }
                // Listed since the inventory: checked again.
                if let Some(foreign) = replaced
                    .iter()
                    .find_map(|p| layout.check_listed(schema_id, p).err())
                {
                    return Err(foreign.refusal(&key, "replace it"));
                }
                m.files.retain(|f| !replaced.contains(&f.path));
                m.files.extend(entries.iter().cloned());
                if !replaced.is_empty() {
                    // Stamped at this attempt: gc's grace starts when they are unlisted.
                    m.retire(&replaced, ctx.clock.now_ms());
                }
                Ok(())
            },
        )
        .await
    }
    .await;
    match committed {
        Ok(_) => {}
        // The save may have landed: the new bases may be listed, so they stay (gc decides).
        Err(e @ Error::AmbiguousCommit { .. }) => return Err(e),
        // Definitely not saved: nothing lists the new bases.
        Err(e) => {
            let keys: Vec<String> = entries.into_iter().map(|e| e.path).collect();
            delete_unlisted(ctx, &keys).await;
            out.forget_files();
            return Err(e);
        }
    }
    // The replaced deltas are not deleted here: readers of the manifests that listed them may
    // still be reading them. The save retired them, and gc deletes them past its grace.
    out.replaced_deltas = deltas.len();
    Ok(())
}

/// What a reader hands over: a page, or that its range is read to the end.
enum Read {
    Page(usize, LivePage),
    Done(usize),
}

/// The readers' pages, and how many readers there are.
struct Reads {
    rx: tokio::sync::mpsc::Receiver<Result<Read>>,
    readers: usize,
}

/// A file being staged: one reader's consecutive pages, held as Arrow until the export scans
/// them.
struct Staging {
    /// The pages' entity and EAV batches (page i is `entities[i]` and `eav[i]`), scanned in
    /// place by the export.
    entities: Vec<RecordBatch>,
    eav: Vec<RecordBatch>,
    /// Their Arrow memory.
    bytes: usize,
    rows: u64,
    /// Smallest row id staged.
    first: Uuid,
    /// Largest row id staged.
    last: Uuid,
}

type Upload = JoinHandle<Result<FileEntry>>;

/// A file is cut once its staged Arrow pages reach this size, whatever the row count, so wide
/// rows cannot make memory grow: at most two files are being written and one staged per
/// reader, besides the pages in flight and DuckDB's own `--memory-limit`. (Splitting the cap
/// between the readers' files was measured: files half as large made init 15% slower.)
const STAGED_BYTES_PER_FILE: usize = 96 * 1024 * 1024;

/// A task that is aborted when its handle is dropped, so a failed init leaves no reader
/// running behind it.
struct Guarded<T>(JoinHandle<T>);

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads pages, stages them, writes files and uploads them, overlapping the three.
async fn export_files(
    ctx: &Context,
    opts: &InitOptions,
    schema_id: i16,
    def: &SchemaDef,
    out: &mut SchemaInit,
) -> Result<Vec<FileEntry>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Read>>(2);
    let client = ctx.connector.connect().await?;
    let ranges = live::live_ranges(&client, &ctx.tables, schema_id, opts.readers).await?;
    // The planner's estimate (no scan: an exact count would read the table a second time,
    // competing with the export) is enough for the progress total and to size the last files;
    // without one, progress shows rows done only.
    let estimate = live::estimate_live(&client, &ctx.tables, schema_id)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(schema_id, error = %e.chain(), "no row estimate for init's progress");
            0
        });
    let estimate = u64::try_from(estimate).unwrap_or(0);
    let heap = heap_plan(ctx, opts, &client, schema_id, def, estimate).await?;
    drop(client);
    if let Some(plan) = heap {
        out.heap_order = true;
        return export_heap(ctx, opts, schema_id, def, plan, estimate, out).await;
    }
    let snapshot = live::ExportedSnapshot::export(&ctx.connector).await?;
    let readers: Vec<Guarded<()>> = (ranges.iter().copied().enumerate())
        .map(|(reader, range)| {
            let ticket = snapshot.ticket();
            spawn_reader(ctx, opts, def, schema_id, reader, range, ticket, tx.clone())
        })
        .collect();
    // The holder's transaction ends once every reader has imported the snapshot.
    let released = snapshot.release();
    // The channel ends when every reader has dropped its sender.
    drop(tx);
    let mut reads = Reads {
        rx,
        readers: ranges.len(),
    };
    // On success every reader has reported its range done; on failure dropping them aborts
    // any read still in flight.
    let (result, released) = tokio::join!(
        stage_and_upload(ctx, opts, schema_id, def, &mut reads, estimate, out),
        released
    );
    drop(readers);
    released.and(result)
}

/// Heap bytes per row-id bucket of a heap-order read: each bucket is loaded whole and becomes
/// one file, so this bounds a loaded bucket's Arrow memory (below [`STAGED_BYTES_PER_FILE`],
/// leaving room for a sample's uneven cuts).
const HEAP_BUCKET_BYTES: u64 = 64 * 1024 * 1024;

/// The heap-order read of this schema, if init reads it so (`--read-order`).
async fn heap_plan(
    ctx: &Context,
    opts: &InitOptions,
    client: &crate::source::Client,
    schema_id: i16,
    def: &SchemaDef,
    estimate: u64,
) -> Result<Option<HeapPlan>> {
    let bucket_rows = rows_per_file(opts, estimated_row_bytes(def));
    let chunk_rows = u64::try_from(opts.page_rows.max(1)).unwrap_or(1);
    let Some(plan) = heap_read::plan(
        client,
        &ctx.tables,
        schema_id,
        opts.read_order,
        estimate,
        bucket_rows,
        HEAP_BUCKET_BYTES,
        chunk_rows,
    )
    .await?
    else {
        return Ok(None);
    };
    // The spill holds about the schema's share of both tables; the files being written from
    // it take two more at most (docs/design.md §4.2).
    let Some(measure) = opts.free_space else {
        return Ok(Some(plan));
    };
    let spill = plan.scratch_estimate();
    let needed = spill.saturating_add(opts.target_file_size.saturating_mul(2).min(spill));
    let free = measure(&opts.work_dir).map_err(|source| Error::Io {
        op: "measure free space of work dir",
        path: opts.work_dir.clone(),
        source,
    })?;
    if job::spill_fits(opts.read_order, &opts.work_dir, HEAP_STEP, needed, free)? {
        return Ok(Some(plan));
    }
    tracing::warn!(
        schema_id,
        needed,
        free,
        work_dir = %opts.work_dir.display(),
        "not enough free space for a heap-order read: reading in row-id order"
    );
    Ok(None)
}

/// What a refused `--read-order heap` names as needing the room.
const HEAP_STEP: &str = "a heap-order read (its spill; --read-order row-id needs none)";

/// A heap-order read (docs/design.md §4.2): the readers scan the tables' heap ranges in one
/// exported snapshot into row-id buckets spilled to the scratch directory; then each bucket
/// is loaded, sorted and staged as one reader's single page, in row-id order, while the files
/// before it are written and uploaded. Page hooks run after each heap range a reader reads.
async fn export_heap(
    ctx: &Context,
    opts: &InitOptions,
    schema_id: i16,
    def: &SchemaDef,
    plan: HeapPlan,
    estimate: u64,
    out: &mut SchemaInit,
) -> Result<Vec<FileEntry>> {
    let started = Instant::now();
    let readers = heap_read::open_readers(&ctx.connector, opts.readers.max(1) as usize).await?;
    let snapshot = live::ExportedSnapshot::export(&ctx.connector).await?;
    let tickets = readers.iter().map(|_| snapshot.ticket()).collect();
    let released = snapshot.release();
    let (hook, shutdown) = (opts.page_hook(), ctx.shutdown.clone());
    let after_chunk = move || {
        let (hook, shutdown) = (hook.clone(), shutdown.clone());
        async move {
            if let Some(h) = &hook {
                h(Uuid::nil()).await;
            }
            // init publishes all or nothing: a stop ends the read at once.
            if shutdown.is_requested() {
                return Err(Error::Stopped);
            }
            Ok(())
        }
    };
    let read = heap_read::read_buckets(
        readers,
        tickets,
        &ctx.tables,
        def,
        schema_id,
        &plan,
        &opts.work_dir,
        after_chunk,
    );
    let (spilled, released) = tokio::join!(read, released);
    let spilled = std::sync::Arc::new(released.and(spilled)?);
    out.scratch_bytes = spilled.bytes();
    let buckets = spilled.buckets();
    tracing::info!(
        schema_id,
        buckets,
        scratch_bytes = out.scratch_bytes,
        read_ms = started.elapsed().as_millis() as u64,
        "init read the heap into row-id buckets"
    );
    // One bucket is loaded while the Stager writes the ones before it.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Read>>(1);
    let loader = Guarded(tokio::spawn(async move {
        for bucket in 0..buckets {
            let s = spilled.clone();
            let page = tokio::task::spawn_blocking(move || s.load(bucket))
                .await
                .map_err(Error::task("load a row-id bucket"))
                .and_then(|p| p);
            let sent = match page {
                Ok(Some(page)) => tx.send(Ok(Read::Page(bucket, page))).await,
                Ok(None) => Ok(()),
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            if sent.is_err() || tx.send(Ok(Read::Done(bucket))).await.is_err() {
                return;
            }
        }
    }));
    let mut reads = Reads {
        rx,
        readers: buckets,
    };
    let result = stage_and_upload(ctx, opts, schema_id, def, &mut reads, estimate, out).await;
    drop(loader);
    result
}

/// Reader `reader`: reads its row-id range in keyset pages, all in the exported snapshot of
/// `ticket`, on a tapped connection of its own and sends each page (then `Done`, or the first
/// error) down `tx`.
#[allow(clippy::too_many_arguments)]
fn spawn_reader(
    ctx: &Context,
    opts: &InitOptions,
    def: &SchemaDef,
    schema_id: i16,
    reader: usize,
    range: IdRange,
    ticket: live::SnapshotTicket,
    tx: tokio::sync::mpsc::Sender<Result<Read>>,
) -> Guarded<()> {
    let (connector, tables, def, limit, hook) = (
        ctx.connector.clone(),
        ctx.tables.clone(),
        def.clone(),
        // A page never holds more rows than a file may.
        opts.page_rows
            .min(i64::try_from(opts.max_file_rows).unwrap_or(i64::MAX))
            .max(1),
        opts.page_hook(),
    );
    Guarded(tokio::spawn(async move {
        let connected = match connector.connect_tapped().await {
            Ok(c) => live::tune_for_pages(&c.client).await.map(|()| c),
            Err(e) => Err(e),
        };
        let mut conn = match connected {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        let pages = tx.clone();
        let read = live::read_range(
            &mut conn,
            ticket,
            &tables,
            &def,
            schema_id,
            range,
            limit,
            |page| {
                let (pages, hook, last) = (pages.clone(), hook.clone(), page.last);
                async move {
                    if pages.send(Ok(Read::Page(reader, page))).await.is_err() {
                        return false;
                    }
                    if let Some(h) = &hook {
                        h(last).await;
                    }
                    true
                }
            },
        )
        .await;
        let _ = tx
            .send(match read {
                Ok(()) => Ok(Read::Done(reader)),
                Err(e) => Err(e),
            })
            .await;
    }))
}

async fn stage_and_upload(
    ctx: &Context,
    opts: &InitOptions,
    schema_id: i16,
    def: &SchemaDef,
    reads: &mut Reads,
    estimate: u64,
    out: &mut SchemaInit,
) -> Result<Vec<FileEntry>> {
    let mut stager = Stager::new(ctx, opts, schema_id, def, estimate, reads.readers).await?;
    match stager.run(reads, out).await {
        Ok(()) => Ok(stager.files.entries),
        Err(e) => {
            stager.abandon(out).await;
            Err(e)
        }
    }
}

/// Turns the readers' pages into files: stages each reader's pages, cuts a file when it is
/// large enough, and keeps its export and upload going while the next pages arrive.
struct Stager<'a> {
    ctx: &'a Context,
    opts: &'a InitOptions,
    schema_id: i16,
    def: &'a SchemaDef,
    /// The planner's estimate of the live rows (0 when unknown).
    estimate: u64,
    files: Files,
    /// One file being staged per reader: a file holds one contiguous run of row ids, so base
    /// files never overlap in range.
    staging: Vec<Option<Staging>>,
    /// Readers that have not reported their range done.
    active: usize,
    started: Instant,
    staged_total: u64,
}

impl<'a> Stager<'a> {
    /// Opens the export engines, which share `--memory-limit`.
    async fn new(
        ctx: &'a Context,
        opts: &'a InitOptions,
        schema_id: i16,
        def: &'a SchemaDef,
        estimate: u64,
        readers: usize,
    ) -> Result<Self> {
        let mut files = Files::default();
        let mut cfg = opts.engine.clone();
        cfg.memory_limit = config::share_memory_limit(&cfg.memory_limit, EXPORTS_IN_FLIGHT);
        for _ in 0..EXPORTS_IN_FLIGHT {
            let cfg = cfg.clone();
            files
                .engines
                .push(blocking(move || Engine::open(&cfg)).await?);
        }
        Ok(Self {
            ctx,
            opts,
            schema_id,
            def,
            estimate,
            files,
            staging: (0..readers).map(|_| None).collect(),
            active: readers,
            started: Instant::now(),
            staged_total: 0,
        })
    }

    async fn run(&mut self, reads: &mut Reads, out: &mut SchemaInit) -> Result<()> {
        while let Some(read) = reads.rx.recv().await {
            // init publishes all or nothing: on a stop, what was staged and uploaded goes.
            if self.ctx.shutdown.is_requested() {
                return Err(Error::Stopped);
            }
            match read? {
                Read::Page(reader, page) => self.stage(reader, page, out).await?,
                Read::Done(reader) => self.reader_done(reader, out).await?,
            }
        }
        self.finish(out).await
    }

    /// Starts the file that `staged` holds (`None`: the one zero-row base of an empty schema).
    async fn start(&mut self, staged: Option<Staging>, out: &mut SchemaInit) -> Result<()> {
        let (ctx, opts, def) = (self.ctx, self.opts, self.def);
        self.files
            .start(ctx, opts, self.schema_id, def, staged, out)
            .await
    }

    /// A reader's last run of rows is a file of its own.
    async fn reader_done(&mut self, reader: usize, out: &mut SchemaInit) -> Result<()> {
        self.active = self.active.saturating_sub(1);
        let staged = self.staging.get_mut(reader).and_then(Option::take);
        if staged.is_some() {
            self.start(staged, out).await?;
        }
        Ok(())
    }

    async fn stage(&mut self, reader: usize, page: LivePage, out: &mut SchemaInit) -> Result<()> {
        let page_rows = page.rows as u64;
        // A file never passes --max-file-rows: what is staged is cut before a page that would
        // take it past (pages are at most that long).
        let full = self
            .staging
            .get(reader)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.rows > 0 && s.rows + page_rows > self.opts.max_file_rows);
        if full {
            let staged = self.staging.get_mut(reader).and_then(Option::take);
            self.start(staged, out).await?;
        }
        let slot = self
            .staging
            .get_mut(reader)
            .ok_or_else(|| Error::Invariant(format!("a page from unknown reader {reader}")))?;
        let s = slot.get_or_insert(Staging {
            entities: Vec::new(),
            eav: Vec::new(),
            bytes: 0,
            rows: 0,
            first: page.first,
            last: page.last,
        });
        s.rows += page_rows;
        // A reader's pages come in keyset order.
        s.last = page.last;
        s.bytes += page.entities.get_array_memory_size() + page.eav.get_array_memory_size();
        s.entities.push(page.entities);
        s.eav.push(page.eav);
        let (rows, bytes) = (s.rows, s.bytes);
        self.staged_total += page_rows;
        // While reading, the total stays above the rows done: the run is not over.
        let total = self.estimate.max(self.staged_total + 1);
        if let Some(p) = &self.opts.progress {
            p(self.schema_id, self.staged_total, total);
        }
        // A finished export's upload starts at once.
        while self
            .files
            .writing
            .front()
            .is_some_and(|w| w.task.is_finished())
        {
            self.files
                .finish_oldest(self.ctx, self.schema_id, out)
                .await?;
        }
        if self.cut_now(rows, bytes) {
            let staged = self.staging.get_mut(reader).and_then(Option::take);
            self.start(staged, out).await?;
            let rate = out.rows as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
            tracing::info!(
                schema_id = self.schema_id,
                rows_done = out.rows,
                total,
                rows_per_s = rate as u64,
                "init progress"
            );
        }
        Ok(())
    }

    /// Whether a file staging `rows` rows in `bytes` of Arrow memory is cut now. The last files
    /// are written after reading ends, with nothing left to overlap: when what remains to read
    /// would fit in a quarter file, this file is cut early so the last ones are that small
    /// remainder.
    fn cut_now(&self, rows: u64, bytes: usize) -> bool {
        let row_bytes = self
            .files
            .bytes_per_row
            .unwrap_or_else(|| estimated_row_bytes(self.def));
        let target_rows = rows_per_file(self.opts, row_bytes);
        let left = self.estimate.saturating_sub(self.staged_total);
        let before_tail = left > 0 && left <= target_rows / 4 && rows >= target_rows / 2;
        rows >= target_rows || bytes >= STAGED_BYTES_PER_FILE || before_tail
    }

    /// Every reader has ended: the last exports and uploads are waited for.
    async fn finish(&mut self, out: &mut SchemaInit) -> Result<()> {
        if self.active > 0 {
            // A reader ended without reading its range to the end (it panicked): publishing
            // now would drop the rest of its rows from the base tier.
            return Err(Error::Invariant(format!(
                "{} init reader(s) stopped before the end of their row-id range",
                self.active
            )));
        }
        if let Some(p) = &self.opts.progress {
            p(self.schema_id, self.staged_total, self.staged_total);
        }
        if self.staged_total == 0 {
            // With no live rows at all, `None` publishes one zero-row base (docs/hazards.md #519).
            self.start(None, out).await?;
        }
        while !self.files.writing.is_empty() {
            self.files
                .finish_oldest(self.ctx, self.schema_id, out)
                .await?;
        }
        while !self.files.uploads.is_empty() {
            self.files.collect_upload(out).await?;
        }
        Ok(())
    }

    /// After a failure or a stop: every export and upload is waited for (an aborted upload
    /// could leave a stray object or multipart upload), then what they wrote is deleted — the
    /// manifest is committed only after all of them.
    async fn abandon(self, out: &mut SchemaInit) {
        let mut files = self.files;
        for w in files.writing.drain(..) {
            abandon(w).await;
        }
        for upload in files.uploads {
            let _ = upload.await;
        }
        delete_unlisted(self.ctx, &files.keys).await;
        out.forget_files();
    }
}

/// Deletes the bases a failing init uploaded (or tried to: a failed upload may still have
/// landed), which no manifest lists. What cannot be deleted is an orphan gc removes.
async fn delete_unlisted(ctx: &Context, keys: &[String]) {
    for key in keys {
        delete_or_leave(
            ctx.lake.store.as_ref(),
            key,
            "unlisted base of a failed init",
        )
        .await;
    }
}

/// Exports written at once, each by its own engine: an export scans, casts and encodes on one
/// thread (the rows arrive joined and sorted, see [`crate::engine::assemble`]), so two keep
/// both cores busy once reading is done.
const EXPORTS_IN_FLIGHT: usize = 2;

/// The files of one init past staging: free engines, exports being written (oldest first),
/// uploads running (oldest first), the entries of the files uploaded and the keys of every
/// upload started.
#[derive(Default)]
struct Files {
    engines: Vec<Engine>,
    writing: VecDeque<Export>,
    uploads: VecDeque<Upload>,
    entries: Vec<FileEntry>,
    /// Every key an upload was started for.
    keys: Vec<String>,
    /// Bytes per row of the last file written: the row-width estimate that sizes the next.
    bytes_per_row: Option<u64>,
}

impl Files {
    /// Starts writing the staged rows (`None`: zero rows) with a free engine. With every
    /// engine busy, the oldest export (which has had the reading of the files since to
    /// finish) is finished first.
    async fn start(
        &mut self,
        ctx: &Context,
        opts: &InitOptions,
        schema_id: i16,
        def: &SchemaDef,
        staged: Option<Staging>,
        out: &mut SchemaInit,
    ) -> Result<()> {
        if self.engines.is_empty() {
            self.finish_oldest(ctx, schema_id, out).await?;
        }
        let engine = self
            .engines
            .pop()
            .ok_or_else(|| Error::Invariant("no engine free for an export".into()))?;
        self.writing
            .push_back(start_export(opts, schema_id, def, engine, staged));
        Ok(())
    }

    /// Waits for the oldest export (if any), frees its engine and starts its upload, keeping
    /// at most one earlier upload running; the file's bytes per row size the next.
    async fn finish_oldest(
        &mut self,
        ctx: &Context,
        schema_id: i16,
        out: &mut SchemaInit,
    ) -> Result<()> {
        let Some(export) = self.writing.pop_front() else {
            return Ok(());
        };
        let (engine, key, upload, bytes_per_row) = finish_file(ctx, schema_id, export).await?;
        self.keys.push(key);
        self.engines.push(engine);
        self.uploads.push_back(upload);
        while self.uploads.len() > 1 {
            self.collect_upload(out).await?;
        }
        self.bytes_per_row = Some(bytes_per_row);
        Ok(())
    }

    /// Waits for the oldest upload (if any) and reports its file.
    async fn collect_upload(&mut self, out: &mut SchemaInit) -> Result<()> {
        if let Some(task) = self.uploads.pop_front() {
            let entry = task.await.map_err(Error::task("upload"))??;
            let (rows, bytes) = (
                u64::try_from(entry.row_count).unwrap_or(0),
                u64::try_from(entry.size_bytes).unwrap_or(0),
            );
            out.rows += rows;
            out.bytes += bytes;
            out.files.push(FileReport {
                path: entry.path.clone(),
                rows,
                bytes,
            });
            self.entries.push(entry);
        }
        Ok(())
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(Error::task("blocking"))?
}

/// A file being written by DuckDB on a blocking thread.
struct Export {
    task: JoinHandle<Result<Exported>>,
    local: PathBuf,
    started: Instant,
}

/// What an export wrote.
struct Exported {
    engine: Engine,
    rows: u64,
    columns: std::collections::BTreeMap<String, String>,
    /// The staged row-id range; `None` for a zero-row base.
    range: Option<(Uuid, Uuid)>,
}

/// Waits for an export nobody will upload and removes its local file.
async fn abandon(export: Export) {
    let _ = export.task.await;
    let _ = tokio::fs::remove_file(&export.local).await;
}

/// Starts writing the staged rows (`None`: zero rows) as one local file.
fn start_export(
    opts: &InitOptions,
    schema_id: i16,
    def: &SchemaDef,
    engine: Engine,
    staged: Option<Staging>,
) -> Export {
    let local = opts
        .work_dir
        .join(format!("lakecdc-init-{}.parquet", Uuid::new_v4()));
    let (def, path) = (def.clone(), local.clone());
    let task = tokio::task::spawn_blocking(move || {
        let (entities, eav, range) = match staged {
            Some(s) => (s.entities, s.eav, Some((s.first, s.last))),
            None => {
                let empty = live::empty_live_page(&def)?;
                (vec![empty.entities], vec![empty.eav], None)
            }
        };
        let inputs = Inputs {
            change_log: &[],
            entities: &entities,
            eav: &eav,
        };
        let rows = engine.export(&def, schema_id, Driver::Entities, inputs, &path)?;
        let info = footer::check_file(&path)?;
        Ok(Exported {
            engine,
            rows,
            columns: info.columns.into_iter().collect(),
            range,
        })
    });
    Export {
        task,
        local,
        started: Instant::now(),
    }
}

/// Waits for an export and starts its upload. Returns the engine, the key uploaded to, the
/// upload and the file's bytes per row (for the next file's size).
async fn finish_file(
    ctx: &Context,
    schema_id: i16,
    export: Export,
) -> Result<(Engine, String, Upload, u64)> {
    let Export {
        task,
        local,
        started,
    } = export;
    let exported = task.await.map_err(Error::task("export"))?;
    let Exported {
        engine,
        rows,
        columns,
        range,
    } = match exported {
        Ok(x) => x,
        Err(e) => {
            let _ = tokio::fs::remove_file(&local).await;
            return Err(e);
        }
    };
    tracing::debug!(
        ms = started.elapsed().as_millis() as u64,
        rows,
        "init step write file"
    );
    let size = tokio::fs::metadata(&local)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    let bytes_per_row = size.checked_div(rows).unwrap_or(1);
    let layout = ctx.lake.layout.clone();
    let key = match range {
        Some((first, last)) => layout.init_base_key(schema_id, first, last, Uuid::now_v7()),
        None => layout.merged_base_key(schema_id, Uuid::now_v7()),
    };
    let (min, max) = range
        .map(|(first, last)| (first.to_string(), last.to_string()))
        .unwrap_or_default();
    let store = ctx.lake.store.clone();
    let now = ctx.clock.now_ms();
    // A base goes straight to its final key: the key is new (a UUID), nothing lists it
    // until the manifest commit, and gc recognises an uncommitted init base as an orphan. The
    // temporary-object dance deltas need (an unlisted delta is never deleted) would only make
    // the store copy every byte a second time.
    let upload_key = key.clone();
    let upload = tokio::spawn(async move {
        let t = Instant::now();
        let result = async {
            let put = store
                .put_file(&key, &local)
                .await
                .map_err(Error::storage("upload base", key.clone()))?;
            Ok(base_entry(
                key.clone(),
                (min, max),
                rows,
                &put,
                columns,
                now,
            ))
        }
        .await;
        let _ = tokio::fs::remove_file(&local).await;
        tracing::debug!(ms = t.elapsed().as_millis() as u64, "init step upload");
        result
    });
    Ok((engine, upload_key, upload, bytes_per_row))
}

/// The manifest entry of base file `key` holding `rows` rows in `range`, uploaded as `put`.
fn base_entry(
    key: String,
    (row_id_min, row_id_max): (String, String),
    rows: u64,
    put: &crate::store::PutResult,
    columns: std::collections::BTreeMap<String, String>,
    now: i64,
) -> FileEntry {
    FileEntry {
        tier: Tier::Base,
        path: key,
        row_id_min,
        row_id_max,
        created_min: now,
        created_max: now,
        size_bytes: i64::try_from(put.size).unwrap_or(i64::MAX),
        row_count: i64::try_from(rows).unwrap_or(i64::MAX),
        checksum: Some(put.checksum()),
        columns: Some(columns),
        extra: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heap_order_read_without_room_falls_back_unless_asked_for() {
        let dir = std::path::Path::new("/work");
        let heap_fits = |order, needed| job::spill_fits(order, dir, HEAP_STEP, needed, 100);
        assert!(heap_fits(ReadOrder::Auto, 100).unwrap());
        assert!(!heap_fits(ReadOrder::Auto, 101).unwrap());
        assert!(heap_fits(ReadOrder::Heap, 100).unwrap());
        let err = heap_fits(ReadOrder::Heap, 101).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NoSpace {
                    needed: 101,
                    free: 100,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("--read-order row-id"), "{err}");
    }
}
