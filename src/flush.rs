//! `lakecdc flush`: exports dirty `change_log` rows as delta Parquet files (docs/design.md §4.1).
//!
//! Per schema, under its advisory lock, each batch runs these side effects in this order:
//!
//! 1. select the oldest dirty slots by `(changed_at, row_id)` (keyset paging) a window at a
//!    time, sorted by `row_id` and cut into batches of `batch_size` (`read_ahead`), and
//! 2. read the batch's slots again and their entity and EAV rows, all in ONE repeatable-read
//!    snapshot, so the file holds exactly the versions read; DuckDB writes the local Parquet
//!    file (the next batches are read meanwhile, on two connections: `read_ahead`);
//! 3. upload it straight to its delta key `{uuidv7}` (an orphan to gc until listed);
//! 4. append the entry to the manifest (conditional write, re-applied on a confirmed conflict);
//!    the data prefix must be this manifest's (`_owner.json`, checked before the first upload,
//!    claimed before the first append when unclaimed);
//! 5. mark `flushed_at = T` where `changed_at` still equals the exported version.
//!
//! What a crash or failure between steps leaves behind: before 3, nothing; during 3, no tmp
//! (it is deleted in band) unless the post-copy delete fails (one tmp for gc); after 3 and
//! before 4 commits, an unlisted delta (gc reports it) and dirty rows; after 4, a listed delta
//! and dirty rows — the next flush writes a second delta with the same versions, which is
//! harmless. No row is ever marked unless its file is listed in a committed manifest.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, stream};
use serde::Serialize;
use tracing::Instrument;
use uuid::Uuid;

use crate::engine::Driver;
use crate::engine::export::Inputs;
use crate::engine::{Engine, EngineConfig};
use crate::error::{Error, Result};
use crate::job;
use crate::lake::manifest::{CommitPolicy, Committed, FileEntry, Loaded, SaveFrom, Tier};
use crate::lake::{Layout, SourceGuard, footer, owner};
pub use crate::report::FileReport;
use crate::report::label;
use crate::schema::{SchemaDef, dir};
use crate::source::connect::TappedClient;
use crate::source::lock::SchemaLock;
use crate::source::registry::{self, Kind, Registered};
use crate::source::snapshot::{self, Selected, Snapshot};
use crate::source::stats;
use crate::source::table_source;
use crate::store::{ObjectStore, delete_or_leave};
use marks::Marks;

mod heap_pass;
mod marks;
mod read_ahead;
mod table;

/// A test seam called with the schema id and the batch's row ids.
pub type Hook = Arc<dyn Fn(i16, Vec<Uuid>) -> BoxFuture<'static, ()> + Send + Sync>;

/// Test seams inside a batch. Only [`run_with_hooks`] (the `testing` feature) takes them: the
/// shipped binary runs none.
#[derive(Clone, Default)]
pub struct FlushHooks {
    /// After selection, before the snapshot is read.
    pub before_export: Option<Hook>,
    /// After the manifest commit, before the mark.
    pub before_mark: Option<Hook>,
    /// Before a second read connection is opened, and before a heap pass opens its sessions
    /// (called with no row ids).
    pub before_second_connection: Option<Hook>,
}

impl std::fmt::Debug for FlushHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlushHooks")
            .field("before_export", &self.before_export.is_some())
            .field("before_mark", &self.before_mark.is_some())
            .field(
                "before_second_connection",
                &self.before_second_connection.is_some(),
            )
            .finish()
    }
}

pub use crate::job::Context;
pub use crate::policy::FlushThresholds;
pub use crate::source::heap_read::ReadOrder;

/// Batches cut from one selection window by default: a batch then spans a twentieth of the
/// window's row-id range (docs/design.md §4.1).
pub const WINDOW_BATCHES: u32 = 20;

/// Flush options (defaults as in docs/design.md §4.1).
#[derive(Debug, Clone)]
pub struct FlushOptions {
    /// Schema names or ids; empty = every schema with dirty rows.
    pub schemas: Vec<String>,
    /// Schemas flushed at once.
    pub parallelism: usize,
    /// Flush when at least this many rows are dirty.
    pub min_records: i64,
    /// Flush when the oldest dirty row is at least this old.
    pub max_age: Duration,
    /// Flush regardless of the thresholds.
    pub force: bool,
    /// Rows per batch (and per delta file).
    pub batch_size: i64,
    /// Batches cut from one selection window: the oldest `window_batches × batch_size` dirty
    /// slots are selected at once, sorted by row id and cut into batches (docs/design.md §4.1).
    pub window_batches: u32,
    /// Stop a schema after this many batches.
    pub max_batches: Option<u32>,
    /// Start no batch after this much time.
    pub time_budget: Duration,
    /// The most row bytes a table source's scan keeps at once (docs/design.md §9.2): a larger
    /// backlog is read in several passes.
    pub scan_memory: u64,
    /// The most touches one read of a table source holds (about 80 bytes each): a larger
    /// backlog is read again, in a new snapshot, once they are exported and marked, within the
    /// time budget.
    pub max_touches: usize,
    /// How a large backlog of scattered row ids is read: by windows of lookups, or by heap
    /// passes (docs/design.md §4.1, "Heap passes").
    pub read_order: ReadOrder,
    /// Plan only: lock, stats and selection, nothing written.
    pub dry_run: bool,
    /// Where local Parquet files are written.
    pub work_dir: PathBuf,
    /// DuckDB settings.
    pub engine: EngineConfig,
    /// Manifest commit bounds.
    pub commit: CommitPolicy,
}

impl FlushOptions {
    /// The numbers that decide whether a schema is due.
    pub fn thresholds(&self) -> FlushThresholds {
        FlushThresholds {
            min_records: self.min_records,
            max_age: self.max_age,
            force: self.force,
        }
    }
}

impl Default for FlushOptions {
    fn default() -> Self {
        Self {
            schemas: Vec::new(),
            parallelism: 2,
            min_records: 20_000,
            max_age: Duration::from_secs(3600),
            force: false,
            batch_size: 10_000,
            window_batches: WINDOW_BATCHES,
            max_batches: None,
            time_budget: Duration::from_secs(50),
            scan_memory: 256 << 20,
            max_touches: crate::source::table_source::MAX_TOUCHES,
            read_order: ReadOrder::Auto,
            dry_run: false,
            work_dir: std::env::temp_dir(),
            engine: EngineConfig::default(),
            commit: CommitPolicy::default(),
        }
    }
}

/// What happened to one schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// At least one batch was exported (or, in a dry run, planned).
    Flushed,
    /// Dirty rows exist but neither threshold is reached.
    BelowThreshold,
    /// Another process holds the schema lock; it is doing this work.
    Locked,
    /// No dirty rows.
    NothingToDo,
    /// A stop request came before any batch was exported (or before the schema was started);
    /// its rows stay dirty.
    Stopped,
    /// A step failed; rows stay dirty.
    Failed,
}

/// The report for one schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemaReport {
    /// Schema id.
    pub schema_id: i16,
    /// Schema name.
    pub schema: String,
    /// Outcome.
    pub outcome: Outcome,
    /// Why (threshold numbers, the failure), when useful.
    pub reason: Option<String>,
    /// Dirty rows when the schema was examined.
    pub dirty_rows: i64,
    /// Batches exported (or planned).
    pub batches: u32,
    /// Of those, the dense batches read by one range rather than a lookup per row: a
    /// schema's by its row-id range (docs/design.md §4.1), a table source's by one key range
    /// scan (§9.2).
    pub batches_by_range: u32,
    /// Rows read by table scans rather than a lookup per row: a schema's heap passes
    /// (docs/design.md §4.1), a table source's scans of a hashed key's backlog (§9.2).
    pub rows_by_scan: u64,
    /// The table scans (passes over the whole tables) those took.
    pub table_scans: u32,
    /// Rows written to delta files.
    pub rows_exported: u64,
    /// Rows marked flushed.
    pub rows_marked: u64,
    /// Rows exported but left dirty because they changed meanwhile.
    pub rows_left_dirty: u64,
    /// Files written (or planned).
    pub files: Vec<FileReport>,
    /// Bytes written.
    pub bytes: u64,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

impl SchemaReport {
    fn new(reg: &Registered) -> Self {
        Self {
            schema_id: reg.id,
            schema: reg.name.clone(),
            outcome: Outcome::NothingToDo,
            reason: None,
            dirty_rows: 0,
            batches: 0,
            batches_by_range: 0,
            rows_by_scan: 0,
            table_scans: 0,
            rows_exported: 0,
            rows_marked: 0,
            rows_left_dirty: 0,
            files: Vec::new(),
            bytes: 0,
            duration_ms: 0,
        }
    }
}

/// The report of a whole run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlushReport {
    /// True for `--dry-run`.
    pub dry_run: bool,
    /// Per schema, by id.
    pub schemas: Vec<SchemaReport>,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// The registered schemas in the run's scope (`--schema`, or all) it left out, having no
    /// dirty rows, as (id, name): the metrics keep their series, written 0 (docs/operations.md,
    /// "Metrics"). Not part of the JSON report.
    #[serde(skip)]
    pub idle: Vec<(i16, String)>,
}

impl FlushReport {
    /// True when any schema failed.
    pub fn failed(&self) -> bool {
        self.schemas.iter().any(|s| s.outcome == Outcome::Failed)
    }

    /// The human-readable table.
    pub fn to_text(&self) -> String {
        // An idle run (no schema with dirty rows) prints nothing: a per-minute cron mails
        // whatever a job prints.
        if self.schemas.is_empty() {
            return String::new();
        }
        let mut out = format!(
            "{:<24} {:>6} {:<16} {:>9} {:>7} {:>10} {:>10} {:>10} {:>6} {:>12} {:>9}\n",
            "SCHEMA",
            "ID",
            "OUTCOME",
            "DIRTY",
            "BATCHES",
            "EXPORTED",
            "MARKED",
            "LEFT",
            "FILES",
            "BYTES",
            "MS"
        );
        for s in &self.schemas {
            let outcome = label(&s.outcome);
            out.push_str(&format!(
                "{:<24} {:>6} {:<16} {:>9} {:>7} {:>10} {:>10} {:>10} {:>6} {:>12} {:>9}\n",
                s.schema,
                s.schema_id,
                outcome,
                s.dirty_rows,
                s.batches,
                s.rows_exported,
                s.rows_marked,
                s.rows_left_dirty,
                s.files.len(),
                s.bytes,
                s.duration_ms
            ));
            if let Some(reason) = &s.reason {
                out.push_str(&format!(
                    "    {}\n",
                    crate::report::printable(reason, false)
                ));
            }
        }
        if self.dry_run {
            out.push_str("dry run: nothing was written\n");
            for s in &self.schemas {
                for (i, f) in s.files.iter().enumerate() {
                    out.push_str(&format!(
                        "    would write {} file {} with {} rows\n",
                        s.schema,
                        i + 1,
                        f.rows
                    ));
                }
            }
        }
        out
    }
}

/// Last `flushed_at` handed out by this process: marks are strictly increasing, so two
/// back-to-back flushes of one row never collide on the `(schema_id, row_id, flushed_at)` key.
static LAST_FLUSHED_AT: AtomicI64 = AtomicI64::new(0);

fn next_flushed_at(now: i64) -> i64 {
    let mut last = LAST_FLUSHED_AT.load(Ordering::SeqCst);
    loop {
        let next = now.max(last + 1);
        match LAST_FLUSHED_AT.compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// Runs one flush pass over the selected schemas.
pub async fn run(ctx: &Context, opts: &FlushOptions) -> Result<FlushReport> {
    run_hooked(ctx, opts, &FlushHooks::default()).await
}

/// [`run`] with test seams (the `testing` feature only: docs/security.md).
#[cfg(any(test, feature = "testing"))]
pub async fn run_with_hooks(
    ctx: &Context,
    opts: &FlushOptions,
    hooks: &FlushHooks,
) -> Result<FlushReport> {
    run_hooked(ctx, opts, hooks).await
}

async fn run_hooked(ctx: &Context, opts: &FlushOptions, hooks: &FlushHooks) -> Result<FlushReport> {
    let (scratch, engine) = job::scratch(&opts.work_dir, &opts.engine)?;
    let opts = &FlushOptions {
        work_dir: scratch.path().to_path_buf(),
        engine,
        ..opts.clone()
    };
    let started = Instant::now();
    let client = ctx.connector.connect().await?;
    let registered = registry::list_all(&client, &ctx.tables).await?;
    let targets = if opts.schemas.is_empty() {
        let mut dirty = stats::dirty_schemas(&client, &ctx.tables.change_log).await?;
        dirty.extend(table_source::dirty_sources(&client, &ctx.tables).await?);
        dirty.sort_unstable();
        dirty.dedup();
        dirty
            .iter()
            .map(|id| {
                registered.iter().find(|r| r.id == *id).cloned().ok_or_else(|| {
                    Error::config(format!(
                        "schema id {id} has dirty change_log rows but is not in the registry {}; run init-db with its metadata",
                        ctx.tables.registry.quoted()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?
    } else {
        registry::select(&registered, &opts.schemas)?
    };
    let in_scope: Vec<(i16, String)> = match opts.schemas.is_empty() {
        true => &registered,
        false => &targets,
    }
    .iter()
    .map(|r| (r.id, r.name.clone()))
    .collect();
    // Which database this run reads: a lake written from another is refused (docs/design.md
    // §10).
    let source = job::source_guard_on(ctx, &client).await?;
    drop(client);
    // Pre-flight (docs/hazards.md #193): every schema's metadata resolves before any side effect.
    let mut work = Vec::with_capacity(targets.len());
    for reg in targets {
        let def = match reg.kind {
            // A table source's columns come from the catalog (docs/design.md §9).
            Kind::Table => None,
            Kind::Schema => {
                let dir = ctx.schema_dir.as_deref().ok_or_else(|| {
                    Error::setting(
                        "schema-dir",
                        format!("is not set, and schema {} has rows to flush", reg.name),
                    )
                })?;
                Some(dir::load(dir, &reg.name)?)
            }
        };
        work.push((reg, def));
    }
    let parallelism = opts.parallelism.max(1);
    let source = &source;
    let mut schemas: Vec<SchemaReport> = stream::iter(work)
        .map(|(reg, def)| async move {
            match def {
                Some(def) => flush_schema(ctx, opts, hooks, source, reg, def).await,
                None => {
                    let span = tracing::info_span!("flush", schema = %reg.name, schema_id = reg.id);
                    table::flush(ctx, opts, hooks, source, &reg)
                        .instrument(span)
                        .await
                }
            }
        })
        .buffer_unordered(parallelism)
        .collect()
        .await;
    schemas.sort_by_key(|s| s.schema_id);
    // A run that worked on no schema never reached the lake: one request proves it is there,
    // so a missing bucket or a wrong key fails the first run after a typo, not the first one
    // with work, an hour later.
    let worked = |s: &SchemaReport| matches!(s.outcome, Outcome::Flushed | Outcome::Failed);
    if !schemas.iter().any(worked)
        && let Some(reg) = registered.first()
    {
        let key = ctx.lake.layout.manifest_key(reg.id);
        // A ranged GET, not a HEAD: a HEAD's 404 carries no body, so a missing bucket would
        // read as a missing object.
        match ctx.lake.store.get_range(&key, 0, 1).await {
            Err(e) if !e.is_not_found() => {
                return Err(Error::storage("reach the lake: read manifest", key)(e));
            }
            _ => {}
        }
    }
    let idle = in_scope
        .into_iter()
        .filter(|(id, _)| !schemas.iter().any(|s| s.schema_id == *id))
        .collect();
    let report = FlushReport {
        dry_run: opts.dry_run,
        schemas,
        duration_ms: elapsed_ms(started),
        idle,
    };
    tracing::info!(
        schemas = report.schemas.len(),
        failed = report
            .schemas
            .iter()
            .filter(|s| s.outcome == Outcome::Failed)
            .count(),
        rows_exported = report.schemas.iter().map(|s| s.rows_exported).sum::<u64>(),
        rows_marked = report.schemas.iter().map(|s| s.rows_marked).sum::<u64>(),
        files = report.schemas.iter().map(|s| s.files.len()).sum::<usize>(),
        dry_run = opts.dry_run,
        duration_ms = report.duration_ms,
        exit_code = i32::from(report.failed()),
        "flush done"
    );
    Ok(report)
}

/// One debug event per batch step, for finding where a flush spends its time (`-v`).
fn step_done(step: &'static str, since: Instant) {
    tracing::debug!(step, ms = elapsed_ms(since), "batch step");
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

async fn flush_schema(
    ctx: &Context,
    opts: &FlushOptions,
    hooks: &FlushHooks,
    source: &SourceGuard,
    reg: Registered,
    def: SchemaDef,
) -> SchemaReport {
    let started = Instant::now();
    let mut report = SchemaReport::new(&reg);
    if ctx.shutdown.is_requested() {
        stopped(&mut report, false);
        return report;
    }
    let span = tracing::info_span!("flush", schema = %reg.name, schema_id = reg.id);
    under_lock(
        ctx,
        &reg,
        report,
        started,
        opts.dry_run,
        async |lock, report| {
            let sf = SchemaFlush {
                ctx,
                opts,
                hooks,
                source,
                def: &def,
                schema_id: reg.id,
                lock,
            };
            flush_locked(&sf, report).await
        },
    )
    .instrument(span)
    .await
}

/// Runs `work` under the schema's lock and records how it ended in `report`: locked
/// elsewhere, failed with its error, and the wall time.
async fn under_lock(
    ctx: &Context,
    reg: &Registered,
    mut report: SchemaReport,
    started: Instant,
    plan: bool,
    work: impl AsyncFnOnce(&SchemaLock, &mut SchemaReport) -> Result<()>,
) -> SchemaReport {
    let result = crate::job::with_lock_or_plan(ctx, reg.id, plan, async |lock| {
        work(lock, &mut report).await
    })
    .await;
    match result {
        Ok(Some(())) => {}
        Ok(None) => {
            report.outcome = Outcome::Locked;
            report.reason = Some("another process holds the schema lock".into());
        }
        Err(e) => {
            report.outcome = Outcome::Failed;
            report.reason = Some(job::failed("flush", &reg.name, e.chain()));
        }
    }
    report.duration_ms = elapsed_ms(started);
    report
}

/// Why the schema is not flushed now (`None` when it is due).
pub fn below_threshold(opts: &FlushOptions, count: i64, oldest: i64, now: i64) -> Option<String> {
    opts.thresholds().below(count, oldest, now)
}

/// What publishing a batch's file needs, for a schema or a table source.
struct Publisher<'a> {
    ctx: &'a Context,
    opts: &'a FlushOptions,
    hooks: &'a FlushHooks,
    /// The database this run reads: a lake written from another is refused.
    source: &'a SourceGuard,
    schema_id: i16,
    /// The schema's lock: a batch is published only while its session is open.
    lock: &'a SchemaLock,
}

/// What a run's batches are published against, kept from batch to batch: whose data prefix
/// this is (read before the first batch) and the manifest as the run last read or saved it,
/// which the next save starts from instead of reading it again (`manifest::commit_from`).
struct Publishing {
    ownership: owner::Ownership,
    saved: Option<Loaded>,
    /// False once the store refused an etag it had returned (`Committed::resumable`): every
    /// later save of the run reads the manifest first.
    chained: bool,
    /// The history copy of the last save, written while the run goes on; it lands before the
    /// next save and before the run ends.
    copying: Option<tokio::task::JoinHandle<()>>,
}

impl Publishing {
    /// Before the first batch: reads the manifest (its source database must be `source`'s)
    /// and the data prefix's owner marker, at once. When both fail, the source's refusal is
    /// the one returned.
    async fn check(
        store: &dyn ObjectStore,
        layout: &Layout,
        schema_id: i16,
        source: &SourceGuard,
    ) -> Result<Self> {
        let (read, ownership) = tokio::join!(
            owner::check_source(store, layout, schema_id, source),
            owner::check_writable(store, layout, schema_id),
        );
        let read = read?;
        Ok(Self {
            ownership: ownership?,
            saved: read,
            chained: true,
            copying: None,
        })
    }

    /// Takes the run's last save: ownership is now the run's, its history copy is written
    /// while the run goes on, and the next save starts from it while the store takes its
    /// etags back.
    fn after_save(&mut self, store: &Arc<dyn ObjectStore>, mut committed: Committed) {
        self.ownership = owner::Ownership::Ours;
        if let Some(copy) = committed.copy.take() {
            let store = store.clone();
            let task = async move { copy.write(store.as_ref()).await };
            self.copying = Some(tokio::spawn(task.in_current_span()));
        }
        self.chained &= committed.resumable;
        self.saved = committed.into_known().filter(|_| self.chained);
    }

    /// Waits for the history copy in flight, if any (its failure was logged and counted).
    async fn copied(&mut self) {
        if let Some(task) = self.copying.take()
            && let Err(e) = task.await
        {
            tracing::warn!(error = %e, "a manifest history copy did not finish");
        }
    }
}

/// One schema's flush: what every step of its batches needs.
struct SchemaFlush<'a> {
    ctx: &'a Context,
    opts: &'a FlushOptions,
    hooks: &'a FlushHooks,
    /// The database this run reads: a lake written from another is refused.
    source: &'a SourceGuard,
    def: &'a SchemaDef,
    schema_id: i16,
    lock: &'a SchemaLock,
}

impl<'a> SchemaFlush<'a> {
    fn publisher(&self) -> Publisher<'a> {
        Publisher {
            ctx: self.ctx,
            opts: self.opts,
            hooks: self.hooks,
            source: self.source,
            schema_id: self.schema_id,
            lock: self.lock,
        }
    }
}

async fn flush_locked(sf: &SchemaFlush<'_>, report: &mut SchemaReport) -> Result<()> {
    let SchemaFlush {
        ctx,
        opts,
        schema_id,
        ..
    } = *sf;
    let conn = ctx.connector.connect_tapped().await?;
    snapshot::tune_for_lookups(&conn.client).await?;
    let dirty = stats::dirty(&conn.client, &ctx.tables.change_log, schema_id).await?;
    if !due(opts, dirty, ctx.clock.now_ms(), report) {
        return Ok(());
    }
    let mut marks = Marks::default();
    let mut publishing: Option<Publishing> = None;
    let result = drain(sf, conn, &mut marks, &mut publishing, report).await;
    // A started mark always finishes and is accounted for, whatever happened after it; so
    // does a started history copy.
    if let Some(p) = publishing.as_mut() {
        p.copied().await;
    }
    let settled = marks.settle(report).await;
    result.and(settled)
}

/// Whether a schema with `dirty` rows is due now; sets the report's dirty count and outcome
/// (nothing to do, below the thresholds with the numbers, or flushed).
fn due(opts: &FlushOptions, dirty: stats::DirtyStats, now: i64, report: &mut SchemaReport) -> bool {
    report.dirty_rows = dirty.count;
    if dirty.count == 0 {
        report.outcome = Outcome::NothingToDo;
        return false;
    }
    if let Some(reason) = below_threshold(opts, dirty.count, dirty.oldest_changed_at, now) {
        report.outcome = Outcome::BelowThreshold;
        report.reason = Some(reason);
        return false;
    }
    report.outcome = Outcome::Flushed;
    true
}

/// Ends the drain for a stop request: `reading` when it came while the next batch was being
/// read. A drain stopped before its first batch exported nothing.
fn stopped(report: &mut SchemaReport, reading: bool) {
    let when = match (report.batches, reading) {
        (0, _) => "before the first batch",
        (_, true) => "while the next batch was being read",
        (_, false) => "after a complete batch",
    };
    report.reason = Some(format!(
        "stopped by signal {when}; the rest is left for the next run"
    ));
    if report.batches == 0 {
        report.outcome = Outcome::Stopped;
    }
}

/// The batch loop. Batches are read ahead on up to two connections ([`read_ahead`]) while the
/// current one is written, uploaded and committed, and each batch's mark (step 5) runs on a
/// connection of its own while the next batches are exported ([`Marks`]).
async fn drain(
    sf: &SchemaFlush<'_>,
    conn: TappedClient,
    marks: &mut Marks<snapshot::Marker>,
    publishing: &mut Option<Publishing>,
    report: &mut SchemaReport,
) -> Result<()> {
    let SchemaFlush {
        ctx,
        opts,
        def,
        schema_id,
        ..
    } = *sf;
    let started = Instant::now();
    // A stop during a heap pass's scan ends the run with nothing of the pass exported.
    let mut reads = match Reads::open(sf, conn, report.dirty_rows, report, None).await {
        Err(Error::Stopped) => {
            stopped(report, true);
            return Ok(());
        }
        reads => reads?,
    };
    let mut engine: Option<Engine> = None;
    let mut staged: Option<Staged> = None;
    loop {
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
        if let Reads::Pass { pass, .. } = &reads
            && pass.slots_left() == 0
        {
            // The pass's last batch is published and its mark lands first: the next selection
            // would pick its slots again.
            if let Some(st) = staged.take() {
                publish_staged(sf, st, publishing, marks, report).await?;
            }
            marks.close(report).await?;
            match reads.after_pass(sf, report).await {
                Ok(Some(next)) => reads = next,
                Ok(None) => break,
                Err(Error::Stopped) => {
                    stopped(report, true);
                    break;
                }
                Err(e) => return Err(e),
            }
            continue;
        }
        // The batch written last is published while the next one is written, if the next
        // one is read already; otherwise it is published first, so a slow read delays no
        // commit (docs/design.md §4.1, "The drain").
        let mut next = None;
        if let Some(st) = staged.take() {
            match reads.next().now_or_never() {
                Some(fetched) => {
                    next = Some(fetched);
                    staged = Some(st);
                }
                None => publish_staged(sf, st, publishing, marks, report).await?,
            }
        }
        // A stop request while the next batch is still being read ends the run now: the read
        // is read-only, and what it held stays dirty for the next run.
        let next = match next {
            Some(fetched) => fetched,
            None => tokio::select! {
                biased;
                () = ctx.shutdown.requested() => {
                    stopped(report, true);
                    break;
                }
                next = reads.next() => next,
            },
        };
        let next = match next {
            Err(Error::Stopped) => {
                stopped(report, true);
                break;
            }
            Err(e) => {
                // The batch written before the failed read is complete: it is published (and
                // marked) before the run fails.
                if let Some(st) = staged.take() {
                    publish_staged(sf, st, publishing, marks, report).await?;
                }
                return Err(e);
            }
            Ok(next) => next,
        };
        let Some(batch) = next else {
            break;
        };
        // Every slot of the batch was flushed since its window was selected: nothing to write.
        if batch.slots().is_empty() {
            continue;
        }
        report.batches += 1;
        // Before the first batch is written (or planned: a plan fails where the run would),
        // another manifest's prefix fails the schema: its readers would never see deltas
        // written there; the rows stay dirty.
        // So does a manifest written from another database (docs/design.md §4.9); its load
        // also makes a plan fail on a manifest the run could not commit to (malformed, another
        // schema's stamp, too large).
        if publishing.is_none() {
            let (store, layout) = (ctx.lake.store.as_ref(), &ctx.lake.layout);
            *publishing = Some(Publishing::check(store, layout, schema_id, sf.source).await?);
        }
        match batch {
            read_ahead::Fetched::Planned(slots) => {
                report.files.push(FileReport {
                    path: String::new(),
                    rows: slots.len() as u64,
                    bytes: 0,
                });
                report.rows_exported += slots.len() as u64;
            }
            read_ahead::Fetched::Read(mut snap) => {
                match &reads {
                    Reads::Pass { .. } => report.rows_by_scan += snap.versions.len() as u64,
                    Reads::Windows(_) => report.batches_by_range += u32::from(snap.by_range),
                }
                let file = LocalFile(
                    opts.work_dir
                        .join(format!("lakecdc-{}.parquet", Uuid::new_v4())),
                );
                let t = Instant::now();
                let versions = std::mem::take(&mut snap.versions);
                let writing = write_local(
                    opts,
                    def.clone(),
                    schema_id,
                    snap,
                    versions.len(),
                    engine.take(),
                    &file.0,
                );
                // The batch before is published meanwhile; the write is awaited whatever
                // happens, so no file outlives the run.
                let published = match staged.take() {
                    Some(st) => publish_staged(sf, st, publishing, marks, report).await,
                    None => Ok(()),
                };
                let written = writing.await.map_err(Error::task("export")).and_then(|w| w);
                step_done("write parquet", t);
                published?;
                let (e, written) = written?;
                engine = Some(e);
                staged = Some(Staged {
                    versions,
                    file,
                    written,
                });
            }
        }
    }
    // The batch in progress completes: the stop or budget came after it was written.
    if let Some(st) = staged.take() {
        publish_staged(sf, st, publishing, marks, report).await?;
    }
    Ok(())
}

/// A local Parquet file of this run, removed when dropped: once published, or when the run
/// fails or stops before publishing it.
struct LocalFile(PathBuf);

impl Drop for LocalFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove local parquet file");
        }
    }
}

/// A batch written to its local file, not yet published.
struct Staged {
    versions: Vec<Selected>,
    file: LocalFile,
    written: Written,
}

/// Publishes a written batch (steps 3–4) and starts its mark (step 5) once a mark
/// connection is free ([`Marks::start`]).
async fn publish_staged(
    sf: &SchemaFlush<'_>,
    st: Staged,
    publishing: &mut Option<Publishing>,
    marks: &mut Marks<snapshot::Marker>,
    report: &mut SchemaReport,
) -> Result<()> {
    let ctx = sf.ctx;
    let state = publishing.as_mut().ok_or_else(|| {
        Error::Invariant("a batch published before the prefix was checked".into())
    })?;
    let Staged {
        versions,
        file,
        written,
    } = st;
    sf.publisher()
        .publish(&versions, &file.0, written, state, report)
        .await?;
    drop(file);
    let schema_id = sf.schema_id;
    let open = move || async move {
        snapshot::Marker::new(ctx.connector.connect().await?, &ctx.tables).await
    };
    let flushed_at = next_flushed_at(ctx.clock.now_ms());
    let rows = versions.len() as u64;
    let mark = move |m: Arc<snapshot::Marker>| async move {
        m.mark(schema_id, flushed_at, &versions).await
    };
    marks.start(schema_id, open, rows, mark, report).await
}

/// Where a schema's batches come from: heap passes while the backlog calls for them
/// ([`heap_pass`]), then selection windows ([`read_ahead`]).
enum Reads {
    /// A heap pass, with the connection the next pass or the windows read on.
    Pass {
        pass: Box<heap_pass::HeapPass>,
        conn: TappedClient,
        /// The pass took as many slots as a pass may: more may call for another.
        full: bool,
    },
    /// Windows of batches read ahead.
    Windows(read_ahead::ReadAhead),
}

impl Reads {
    /// A heap pass over the schema's oldest of `dirty` slots if the backlog and the tables
    /// call for one (docs/design.md §4.1), else the windows, from past `windows_after` when a
    /// pass before holds every slot up to it ([`heap_pass::HeapPass::windows_after`]).
    async fn open(
        sf: &SchemaFlush<'_>,
        conn: TappedClient,
        dirty: i64,
        report: &mut SchemaReport,
        windows_after: Option<Selected>,
    ) -> Result<Self> {
        let (ctx, opts, schema_id) = (sf.ctx, sf.opts, sf.schema_id);
        let budget = opts.max_batches.map_or(u64::MAX, |m| {
            let batch = u64::try_from(opts.batch_size).unwrap_or(0);
            u64::from(m.saturating_sub(report.batches)).saturating_mul(batch)
        });
        let dirty = u64::try_from(dirty).unwrap_or(0);
        if dirty.min(budget) > 0 {
            let plan = heap_pass::PassPlan {
                ctx,
                tables: &ctx.tables,
                def: sf.def,
                schema_id,
                order: opts.read_order,
                batch_size: opts.batch_size,
                dirty,
                budget,
                dry_run: opts.dry_run,
                work_dir: &opts.work_dir,
                before_export: sf.hooks.before_export.clone(),
                before_sessions: sf.hooks.before_second_connection.clone(),
            };
            if let Some(pass) = heap_pass::HeapPass::start(&plan, &conn.client).await? {
                report.table_scans += 1;
                let full = pass.slots_left() as u64 >= heap_pass::PASS_SLOTS;
                return Ok(Self::Pass {
                    pass: Box::new(pass),
                    conn,
                    full,
                });
            }
        }
        Self::windows(sf, conn, windows_after).await
    }

    /// Selection windows read ahead on `conn`, from the oldest dirty slot or from past
    /// `start_after` (a pass's last slot, [`heap_pass::HeapPass::windows_after`]).
    async fn windows(
        sf: &SchemaFlush<'_>,
        conn: TappedClient,
        start_after: Option<Selected>,
    ) -> Result<Self> {
        let (ctx, opts, schema_id) = (sf.ctx, sf.opts, sf.schema_id);
        let plan = read_ahead::Plan {
            connector: ctx.connector.clone(),
            tables: ctx.tables.clone(),
            def: sf.def.clone(),
            schema_id,
            batch_size: opts.batch_size,
            window_batches: opts.window_batches,
            dry_run: opts.dry_run,
            max_batches: opts.max_batches,
            start_after,
            before_payload: sf.hooks.before_export.clone(),
            before_second_connection: sf.hooks.before_second_connection.clone(),
        };
        Ok(Self::Windows(
            read_ahead::ReadAhead::start(plan, conn).await?,
        ))
    }

    /// What follows a finished pass (its last mark settled): another pass or the windows;
    /// `None` ends a dry run, whose windows would plan the pass's slots again.
    async fn after_pass(
        self,
        sf: &SchemaFlush<'_>,
        report: &mut SchemaReport,
    ) -> Result<Option<Self>> {
        let Self::Pass { conn, full, pass } = self else {
            return Ok(Some(self));
        };
        if sf.opts.dry_run {
            return Ok(None);
        }
        // After a pass that took every dirty slot, what is dirty now was written since: the
        // windows take it. After a full pass the rest of the backlog is weighed again.
        if !full {
            return Self::windows(sf, conn, pass.windows_after())
                .await
                .map(Some);
        }
        let (change_log, schema_id) = (&sf.ctx.tables.change_log, sf.schema_id);
        let dirty = stats::dirty(&conn.client, change_log, schema_id)
            .await?
            .count;
        Self::open(sf, conn, dirty, report, pass.windows_after())
            .await
            .map(Some)
    }

    /// The next batch, or `None` when no slot is left.
    async fn next(&mut self) -> Result<Option<read_ahead::Fetched>> {
        match self {
            Self::Pass { pass, .. } => pass.next().await,
            Self::Windows(reads) => reads.next().await,
        }
    }
}

/// What the local file holds.
struct Written {
    rows: u64,
    columns: std::collections::BTreeMap<String, String>,
}

/// Step 2: starts writing `snap`'s delta file of its `slots` slots at `path` (blocking, on its
/// own thread), on `engine` or a new one; the task hands the engine back.
fn write_local(
    opts: &FlushOptions,
    def: SchemaDef,
    schema_id: i16,
    snap: Snapshot,
    slots: usize,
    engine: Option<Engine>,
    path: &std::path::Path,
) -> tokio::task::JoinHandle<Result<(Engine, Written)>> {
    let cfg = opts.engine.clone();
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let engine = match engine {
            Some(e) => e,
            None => Engine::open(&cfg)?,
        };
        let rows = engine.export(
            &def,
            schema_id,
            Driver::ChangeLog,
            Inputs {
                change_log: std::slice::from_ref(&snap.change_log),
                entities: std::slice::from_ref(&snap.entities),
                eav: std::slice::from_ref(&snap.eav),
            },
            &path,
        )?;
        let info = footer::check_file(&path)?;
        if u64::try_from(info.row_count).ok() != Some(rows) || rows != slots as u64 {
            return Err(Error::Invariant(format!(
                "export wrote {rows} rows ({} in the footer) for {} slots",
                info.row_count, slots
            )));
        }
        Ok((
            engine,
            Written {
                rows,
                columns: info.columns.into_iter().collect(),
            },
        ))
    })
}

impl Publisher<'_> {
    /// Upload → manifest (the mark follows). An unclaimed data prefix is claimed for
    /// this manifest right before the first manifest save, so a run that fails earlier leaves no
    /// claim.
    async fn publish(
        &self,
        versions: &[Selected],
        local: &std::path::Path,
        written: Written,
        publishing: &mut Publishing,
        report: &mut SchemaReport,
    ) -> Result<()> {
        let Publisher {
            ctx,
            opts,
            hooks,
            schema_id,
            ..
        } = *self;
        let store = ctx.lake.store.as_ref();
        let layout = &ctx.lake.layout;
        let t = Instant::now();
        let key = layout.delta_key(schema_id, Uuid::now_v7());
        let staged = job::upload(store, ctx.clock.as_ref(), local, &key, "upload delta").await?;
        let put = staged.put;
        step_done("upload", t);
        let (min, max) = row_id_range(versions);
        let now = ctx.clock.now_ms();
        let entry = FileEntry {
            tier: Tier::Delta,
            path: key.clone(),
            row_id_min: min,
            row_id_max: max,
            created_min: now,
            created_max: now,
            size_bytes: i64::try_from(put.size).unwrap_or(i64::MAX),
            row_count: i64::try_from(written.rows).unwrap_or(i64::MAX),
            checksum: Some(put.checksum()),
            columns: Some(written.columns),
            extra: Default::default(),
        };
        let t = Instant::now();
        // Published only under the lock: once its session is gone another run may be
        // flushing the schema (docs/hazards.md L68). Nothing lists the delta yet.
        if let Err(e) = self.lock.ensure_open() {
            delete_or_leave(store, &key, "unlisted delta").await;
            return Err(e);
        }
        // The last save's history copy lands first: copies stay in version order.
        publishing.copied().await;
        let committed = owner::claim_and_commit(
            store,
            layout,
            schema_id,
            &report.schema,
            &publishing.ownership,
            self.source,
            ctx.clock.as_ref(),
            opts.commit,
            SaveFrom {
                known: publishing.saved.take(),
                leave_copy: true,
            },
            |m| {
                m.files.push(entry.clone());
                Ok(())
            },
        )
        .await;
        match committed {
            Ok(c) => publishing.after_save(&ctx.lake.store, c),
            // The save may have landed and list the delta: it stays (a rerun converges).
            Err(e @ Error::AmbiguousCommit { .. }) => return Err(e),
            // Certainly not saved (the prefix could not be claimed, the manifest could not be read
            // or used, or every conditional write met a newer manifest): nothing lists the delta,
            // and gc never deletes an unlisted delta, so it goes now.
            Err(e) => {
                delete_or_leave(store, &key, "unlisted delta").await;
                return Err(e);
            }
        }
        report.files.push(FileReport {
            path: key,
            rows: written.rows,
            bytes: put.size,
        });
        report.bytes += put.size;
        report.rows_exported += written.rows;
        if let Some(hook) = &hooks.before_mark {
            hook(schema_id, versions.iter().map(|v| v.row_id).collect()).await;
        }
        step_done("commit manifest", t);
        Ok(())
    }
}

/// Smallest and largest row id in UUID byte order.
fn row_id_range(versions: &[Selected]) -> (String, String) {
    let min = versions.iter().map(|v| v.row_id).min();
    let max = versions.iter().map(|v| v.row_id).max();
    (
        min.map(|u| u.to_string()).unwrap_or_default(),
        max.map(|u| u.to_string()).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushed_at_is_strictly_increasing_even_when_the_clock_stalls() {
        let a = next_flushed_at(5_000_000_000_000);
        let b = next_flushed_at(5_000_000_000_000);
        let c = next_flushed_at(4_000_000_000_000);
        assert!(a < b && b < c, "{a} {b} {c}");
    }

    #[test]
    fn thresholds() {
        let opts = FlushOptions::default();
        assert!(below_threshold(&opts, 19_999, 1_000, 1_000 + 3_599_999).is_some());
        assert!(below_threshold(&opts, 20_000, 1_000, 1_000).is_none());
        assert!(below_threshold(&opts, 1, 1_000, 1_000 + 3_600_000).is_none());
        // Versions ahead of the clock are not "old".
        assert!(below_threshold(&opts, 1, 10_000, 1_000).is_some());
        let forced = FlushOptions {
            force: true,
            ..FlushOptions::default()
        };
        assert!(below_threshold(&forced, 1, 10_000, 1_000).is_none());
        // What inspect says of a due schema names the threshold that made it due.
        let t = FlushOptions::default().thresholds();
        assert_eq!(
            t.due_because(20_000, 1_000, 1_000),
            "20000 dirty rows >= --min-records 20000"
        );
        assert_eq!(
            t.due_because(50, 1_000, 1_000 + 3_600_000),
            "50 dirty rows; the oldest is 3600s old, >= --max-age 3600s"
        );
        assert_eq!(
            forced.thresholds().due_because(1, 0, 0),
            "1 dirty rows; --force"
        );
    }

    #[test]
    fn an_idle_run_prints_nothing() {
        // A per-minute cron mails whatever a job prints: an idle run prints no table header.
        let idle = FlushReport {
            dry_run: false,
            schemas: Vec::new(),
            duration_ms: 3,
            idle: vec![(100, "customer".into())],
        };
        assert_eq!(idle.to_text(), "");
        // The schemas left alone are for the metrics only.
        let json = serde_json::to_value(&idle).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"dry_run": false, "schemas": [], "duration_ms": 3})
        );
    }
}
