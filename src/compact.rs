//! `lakecdc compact`: promotes or merges deltas into UUID-named bases (docs/design.md §4.3).
//!
//! No advisory lock: the manifest's conditional write is the only fence, so a flush may run at
//! the same time. A plain-data [`Plan`] decides first (`noop`, `promote`, `rewrite`, with the
//! numbers behind it); `--dry-run` prints it. Side effects of a rewrite, in order:
//!
//! 1. size every listed file (HEAD): one larger than its entry lists is refused, and the work
//!    dir must have room for all of them and the merged file (docs/hazards.md S2); then
//!    download them, hashing while downloading, none past its size; a checksum mismatch refuses
//!    the schema and names the object (unless `--skip-input-checksum-verify`); every file must
//!    carry the system columns;
//! 2. DuckDB merges them (latest `changed_at` per `row_id`, a tombstone wins a tie, tombstones
//!    dropped) into one file sorted by `row_id` — zero survivors still make a zero-row base;
//! 3. upload to `_tmp/`, promote to `base-{uuidv7}.parquet`, delete the tmp;
//! 4. ONE conditional manifest save that removes exactly the merged paths, adds the new base and
//!    records the merged paths under `retired` (for gc). A concurrent flush's delta stays
//!    listed: on a confirmed conflict the splice is re-applied to the fresh manifest. If a merged
//!    path is no longer listed (another compaction or init won), the staged base — provably
//!    unlisted — is deleted and the whole pass retried with backoff.
//!
//! Every listed path must be a data file of the schema before any of this (a dry run included):
//! a foreign one is refused and never requested (docs/hazards.md #417, S1). Sources are never
//! deleted here; gc removes retired files after its grace period, when no in-flight reader can
//! still be opening them (docs/hazards.md #461).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use serde::Serialize;
use uuid::Uuid;

use crate::engine::{Engine, EngineConfig, MergeStats};
use crate::error::{Error, Result};
use crate::job;
use crate::lake::footer;
use crate::lake::manifest::{self, CommitPolicy, FileEntry, Manifest, Tier};
use crate::lake::owner;
use crate::report::label;
use crate::retry::Backoff;
use crate::source::registry::Registered;
use crate::store::{StoreError, delete_or_leave};

/// Compact runs with the shared lake-job context.
pub use crate::job::Context;
pub use crate::job::{available_bytes, check_work_dir_space};
pub use crate::policy::{CompactThresholds, Decision, Plan};

/// A test seam called after the new base is staged, before the manifest save; only
/// [`run_with_hook`] (the `testing` feature) takes one.
pub type Hook = Arc<dyn Fn(i16) -> BoxFuture<'static, ()> + Send + Sync>;

/// Measures the free bytes of the file system holding a directory (for an unprivileged user).
pub type FreeSpace = fn(&Path) -> std::io::Result<u64>;

/// Compact options (defaults as in docs/design.md §4.3).
#[derive(Debug, Clone)]
pub struct CompactOptions {
    /// Schema names or ids; empty = every registered schema.
    pub schemas: Vec<String>,
    /// Promote when the delta tier holds at least this many bytes.
    pub target_base_size: u64,
    /// Rewrite when delta rows / base rows exceeds this ratio.
    pub dirty_ratio: f64,
    /// Merge even when a source's bytes do not match its checksum.
    pub skip_input_checksum_verify: bool,
    /// Whole-pass retries after a lost race.
    pub max_retries: u32,
    /// Print the plan only.
    pub dry_run: bool,
    /// Downloads and DuckDB spill files.
    pub work_dir: PathBuf,
    /// DuckDB settings.
    pub engine: EngineConfig,
    /// Files downloaded at once.
    pub download_parallelism: usize,
    /// The longest a new base may wait between being staged and being listed (see
    /// [`job::COMMIT_LEASE`]).
    pub commit_lease: Duration,
    /// Measures the work dir's free space before a rewrite downloads anything
    /// ([`check_work_dir_space`]; [`available_bytes`] by default); `None` leaves it unmeasured.
    pub free_space: Option<FreeSpace>,
}

impl CompactOptions {
    /// The numbers the compaction decision is made from.
    pub fn thresholds(&self) -> CompactThresholds {
        CompactThresholds {
            target_base_size: self.target_base_size,
            dirty_ratio: self.dirty_ratio,
        }
    }
}

impl Default for CompactOptions {
    fn default() -> Self {
        Self {
            schemas: Vec::new(),
            target_base_size: 256 * 1024 * 1024,
            dirty_ratio: 0.05,
            skip_input_checksum_verify: false,
            max_retries: 5,
            dry_run: false,
            work_dir: std::env::temp_dir(),
            engine: EngineConfig::default(),
            download_parallelism: 4,
            commit_lease: job::COMMIT_LEASE,
            free_space: Some(available_bytes),
        }
    }
}

/// Decides what to do with a manifest (no I/O).
pub fn plan(m: &Manifest, opts: &CompactOptions) -> Plan {
    opts.thresholds().plan(m)
}

/// Outcome for one schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The schema has never been flushed or initialised (no manifest).
    NoManifest,
    /// The plan was carried out (or, in a dry run, only printed).
    Done,
    /// The compaction failed or was refused; nothing was published.
    Failed,
    /// A stop request (SIGTERM/SIGINT) came before this schema was compacted.
    Stopped,
}

/// Report for one schema.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SchemaCompact {
    /// Schema id.
    pub schema_id: i16,
    /// Schema name.
    pub schema: String,
    /// Outcome.
    pub outcome: Outcome,
    /// The plan, when a manifest exists.
    pub plan: Option<Plan>,
    /// Files merged or promoted.
    pub files_in: usize,
    /// Files published.
    pub files_out: usize,
    /// Rows read.
    pub rows_in: u64,
    /// Rows in the new base.
    pub rows_out: u64,
    /// Bytes of the new base.
    pub bytes_out: u64,
    /// The new base's key.
    pub new_base: Option<String>,
    /// Passes attempted.
    pub attempts: u32,
    /// The failure or refusal.
    pub error: Option<String>,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

impl SchemaCompact {
    /// A schema's report before anything was done.
    fn new(reg: &Registered) -> Self {
        Self {
            schema_id: reg.id,
            schema: reg.name.clone(),
            outcome: Outcome::Done,
            plan: None,
            files_in: 0,
            files_out: 0,
            rows_in: 0,
            rows_out: 0,
            bytes_out: 0,
            new_base: None,
            attempts: 0,
            error: None,
            duration_ms: 0,
        }
    }
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompactReport {
    /// True for `--dry-run`.
    pub dry_run: bool,
    /// Per schema, by id.
    pub schemas: Vec<SchemaCompact>,
}

impl CompactReport {
    /// 0 done, 1 when a schema failed or was refused, 3 when a stop request skipped one.
    pub fn exit_code(&self) -> i32 {
        let has = |o| self.schemas.iter().any(|s| s.outcome == o);
        if has(Outcome::Failed) {
            1
        } else if has(Outcome::Stopped) {
            3
        } else {
            0
        }
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "{:<24} {:>6} {:<10} {:>8} {:>9} {:>10} {:>10} {:>12} {:>8}\n",
            "SCHEMA",
            "ID",
            "DECISION",
            "FILES_IN",
            "FILES_OUT",
            "ROWS_IN",
            "ROWS_OUT",
            "BYTES_OUT",
            "MS"
        );
        for s in &self.schemas {
            let decision = match (&s.plan, s.outcome) {
                (_, Outcome::Failed) => "FAILED".to_string(),
                (_, Outcome::Stopped) => "stopped".to_string(),
                (None, _) => "no_manifest".to_string(),
                (Some(p), _) => label(&p.decision),
            };
            out.push_str(&format!(
                "{:<24} {:>6} {:<10} {:>8} {:>9} {:>10} {:>10} {:>12} {:>8}\n",
                s.schema,
                s.schema_id,
                decision,
                s.files_in,
                s.files_out,
                s.rows_in,
                s.rows_out,
                s.bytes_out,
                s.duration_ms
            ));
            if let Some(p) = &s.plan {
                out.push_str(&format!(
                    "    base {} files / {} rows / {} bytes; delta {} files / {} rows / {} bytes; {}\n",
                    p.base_files, p.base_rows, p.base_bytes, p.delta_files, p.delta_rows,
                    p.delta_bytes, p.reason
                ));
            }
            if let Some(b) = &s.new_base {
                out.push_str(&format!(
                    "    new base {}\n",
                    crate::report::printable(b, false)
                ));
            }
            if let Some(e) = &s.error {
                out.push_str(&format!("    {}\n", crate::report::printable(e, false)));
            }
        }
        if self.dry_run {
            out.push_str("dry run: nothing was written\n");
        }
        out
    }
}

/// Runs compaction over the selected schemas.
pub async fn run(ctx: &Context, opts: &CompactOptions) -> Result<CompactReport> {
    run_hooked(ctx, opts, None).await
}

/// [`run`] with a test seam before each manifest save (the `testing` feature only:
/// docs/security.md).
#[cfg(any(test, feature = "testing"))]
pub async fn run_with_hook(
    ctx: &Context,
    opts: &CompactOptions,
    hook: Option<Hook>,
) -> Result<CompactReport> {
    run_hooked(ctx, opts, hook).await
}

async fn run_hooked(
    ctx: &Context,
    opts: &CompactOptions,
    hook: Option<Hook>,
) -> Result<CompactReport> {
    let (scratch, engine) = job::scratch(&opts.work_dir, &opts.engine)?;
    let opts = &CompactOptions {
        work_dir: scratch.path().to_path_buf(),
        engine,
        ..opts.clone()
    };
    let schemas = job::each_schema(
        ctx,
        &opts.schemas,
        |reg| {
            let hook = hook.clone();
            async move { compact_schema(ctx, opts, hook, &reg).await }
        },
        |reg| SchemaCompact {
            outcome: Outcome::Stopped,
            ..SchemaCompact::new(&reg)
        },
    )
    .await?;
    let report = CompactReport {
        dry_run: opts.dry_run,
        schemas,
    };
    tracing::info!(
        schemas = report.schemas.len(),
        failed = report
            .schemas
            .iter()
            .filter(|s| s.outcome == Outcome::Failed)
            .count(),
        rows_out = report.schemas.iter().map(|s| s.rows_out).sum::<u64>(),
        dry_run = opts.dry_run,
        "compact done"
    );
    Ok(report)
}

/// Why a pass must start over.
enum PassError {
    /// A merged path vanished from the manifest: start again from a fresh one.
    Retry(String),
    /// Anything else: the schema fails.
    Fail(Error),
}

impl From<Error> for PassError {
    fn from(e: Error) -> Self {
        PassError::Fail(e)
    }
}

async fn compact_schema(
    ctx: &Context,
    opts: &CompactOptions,
    hook: Option<Hook>,
    reg: &Registered,
) -> SchemaCompact {
    let started = Instant::now();
    let mut out = SchemaCompact::new(reg);
    let policy = CommitPolicy::default();
    loop {
        out.attempts += 1;
        let p = Pass {
            ctx,
            opts,
            hook: hook.clone(),
            schema_id: reg.id,
        };
        match pass(&p, &mut out).await {
            Ok(()) => break,
            Err(PassError::Retry(why)) if out.attempts <= opts.max_retries => {
                tracing::info!(schema_id = reg.id, why, "compaction lost a race; retrying");
                // A lost race waits longer than a manifest conflict: a whole pass reruns.
                let backoff = Backoff {
                    max: Duration::from_secs(10),
                    ..policy.backoff()
                };
                backoff.wait(out.attempts + 1).await;
            }
            Err(PassError::Retry(why)) => {
                out.outcome = Outcome::Failed;
                out.error = Some(format!("gave up after {} passes: {why}", out.attempts));
                break;
            }
            Err(PassError::Fail(e)) => {
                out.outcome = Outcome::Failed;
                out.error = Some(e.chain());
                break;
            }
        }
    }
    out.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    out
}

/// One compaction pass over a schema: what each of its steps needs.
struct Pass<'a> {
    ctx: &'a Context,
    opts: &'a CompactOptions,
    hook: Option<Hook>,
    schema_id: i16,
}

async fn pass(p: &Pass<'_>, out: &mut SchemaCompact) -> Result<(), PassError> {
    let (ctx, opts, schema_id) = (p.ctx, p.opts, p.schema_id);
    let store = ctx.lake.store.as_ref();
    let layout = &ctx.lake.layout;
    let key = layout.manifest_key(schema_id);
    let Some(loaded) = manifest::load_within(store, &key, schema_id, layout.limits()).await? else {
        out.outcome = Outcome::NoManifest;
        return Ok(());
    };
    let plan = plan(&loaded.manifest, opts);
    out.plan = Some(plan.clone());
    if plan.decision == Decision::Noop {
        return Ok(());
    }
    // Promote relabels the listed deltas, rewrite reads and retires every listed file: each
    // must be a data file of this schema (docs/hazards.md #417, S1).
    for f in &loaded.manifest.files {
        if let Err(foreign) = layout.check_listed(schema_id, &f.path) {
            return Err(foreign.refusal(&key, "compact it").into());
        }
    }
    // Its bases live in the data prefix: the prefix must be this manifest's (a dry run checks;
    // a real pass claims an unclaimed one when it publishes).
    let ownership = owner::check_writable(store, &ctx.lake.layout, schema_id).await?;
    if opts.dry_run {
        return Ok(());
    }
    match plan.decision {
        Decision::Noop => Ok(()), // returned above
        Decision::Promote => {
            let deltas: BTreeSet<String> = loaded
                .manifest
                .tier(Tier::Delta)
                .map(|f| f.path.clone())
                .collect();
            owner::claim_and_commit(
                store,
                &ctx.lake.layout,
                schema_id,
                &out.schema,
                &ownership,
                ctx.clock.as_ref(),
                CommitPolicy::default(),
                |m| {
                    for f in m.files.iter_mut().filter(|f| deltas.contains(&f.path)) {
                        f.tier = Tier::Base;
                    }
                    Ok(())
                },
            )
            .await?;
            out.files_in = deltas.len();
            out.files_out = deltas.len();
            Ok(())
        }
        Decision::Rewrite => {
            let dir = opts
                .work_dir
                .join(format!("lakecdc-compact-{}", Uuid::new_v4()));
            crate::scratch::create_dir(&dir).map_err(|source| Error::Io {
                op: "create work dir",
                path: dir.clone(),
                source,
            })?;
            let res = rewrite(p, &ownership, &loaded.manifest, &dir, out).await;
            let _ = tokio::fs::remove_dir_all(&dir).await;
            res
        }
    }
}

/// What the merge step produced.
struct Merged {
    /// Rows in the sources (from their footers, read anyway for the system-column check).
    rows_in: u64,
    stats: MergeStats,
    /// The merged file's columns and types.
    columns: Vec<(String, String)>,
}

/// The most bytes a source's download may take: the size its entry lists, or for an entry
/// without one (older writers) the size the HEAD found. An object larger than its entry lists
/// is refused before it is downloaded (docs/hazards.md S2).
async fn size_source(ctx: &Context, f: &FileEntry) -> Result<u64> {
    let meta = ctx
        .lake
        .store
        .head(&f.path)
        .await
        .map_err(Error::storage("download compaction source", f.path.clone()))?;
    let listed = u64::try_from(f.size_bytes).unwrap_or(0);
    if listed == 0 {
        return Ok(meta.size);
    }
    if meta.size > listed {
        return Err(larger_than_listed(f, meta.size, listed));
    }
    Ok(listed)
}

fn larger_than_listed(f: &FileEntry, size: u64, limit: u64) -> Error {
    Error::TooLarge {
        what: "compaction source",
        key: f.path.clone(),
        size,
        limit,
        why: "larger than its manifest entry lists: corrupt or replaced; not merged".into(),
    }
}

async fn download(
    ctx: &Context,
    opts: &CompactOptions,
    f: &FileEntry,
    bound: u64,
    local: PathBuf,
) -> Result<PathBuf> {
    let dl = ctx
        .lake
        .store
        .get_to_file_within(&f.path, &local, bound)
        .await;
    let dl = match dl {
        Ok(dl) => dl,
        Err(StoreError::TooLarge { size, .. }) => {
            // It grew since it was sized: the download stopped at the bound.
            let _ = tokio::fs::remove_file(&local).await;
            return Err(larger_than_listed(f, size, bound));
        }
        Err(e) => return Err(Error::storage("download compaction source", f.path.clone())(e)),
    };
    let actual = format!("sha256:{}", hex::encode(dl.sha256));
    match &f.checksum {
        Some(want) if *want != actual && !opts.skip_input_checksum_verify => {
            return Err(Error::Parquet {
                path: f.path.clone(),
                message: format!(
                    "checksum mismatch (manifest {want}, object {actual}): the object is corrupt; refusing to merge it (--skip-input-checksum-verify overrides)"
                ),
            });
        }
        Some(want) if *want != actual => {
            tracing::warn!(path = %f.path, "checksum mismatch ignored (--skip-input-checksum-verify)");
        }
        None => tracing::warn!(path = %f.path, "source has no checksum; merged unverified"),
        Some(_) => {}
    }
    Ok(local)
}

/// Rewrites the listed files into one new base: (1) download and verify the sources, (2)
/// merge them, (3) stage the new base, (4) splice it into the manifest in place of the
/// sources, which are retired for gc.
async fn rewrite(
    p: &Pass<'_>,
    ownership: &owner::Ownership,
    m: &Manifest,
    dir: &std::path::Path,
    out: &mut SchemaCompact,
) -> Result<(), PassError> {
    let (sources, spill) = download_sources(p, m, dir).await?;
    let merged_path = dir.join("merged.parquet");
    let merged = merge(p.opts, sources, spill, merged_path.clone()).await?;
    out.files_in = m.files.len();
    out.rows_in = merged.rows_in;
    let staged = stage_base(p, &merged_path).await?;
    if let Some(h) = &p.hook {
        h(p.schema_id).await;
    }
    splice(p, ownership, m, &merged, staged, out).await
}

/// Step 1: every source sized (none larger than listed), the work dir's room checked for all
/// of them and the merged file, then every source downloaded (bounded parallelism, none past
/// its size) and checked against its checksum. Also returns the room left beside the sources
/// and the merged file, DuckDB's spill budget (`None` when free space is not measured).
async fn download_sources(
    p: &Pass<'_>,
    m: &Manifest,
    dir: &std::path::Path,
) -> Result<(Vec<PathBuf>, Option<u64>)> {
    let t = Instant::now();
    let (ctx, opts) = (p.ctx, p.opts);
    let parallelism = opts.download_parallelism.max(1);
    // Owned entries: a future borrowing them would not be `Send` for every lifetime.
    let bounds: Vec<u64> = stream::iter(m.files.clone())
        .map(|f| async move { size_source(ctx, &f).await })
        .buffered(parallelism)
        .collect::<Vec<Result<u64>>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    // The sources, and a merged file at most as large as they are.
    let inputs = bounds.iter().fold(0u64, |sum, b| sum.saturating_add(*b));
    let needed = inputs.saturating_mul(2);
    let spill = match opts.free_space {
        Some(measure) => {
            let free = measure(dir).map_err(|source| Error::Io {
                op: "measure free space of work dir",
                path: dir.to_path_buf(),
                source,
            })?;
            check_work_dir_space(
                dir,
                "compaction (its sources and the merged file)",
                needed,
                free,
            )?;
            Some(free - needed)
        }
        None => {
            tracing::debug!(needed, "work dir free space not measured");
            None
        }
    };
    let sources = stream::iter(m.files.clone().into_iter().zip(bounds).enumerate())
        .map(|(i, (f, bound))| async move {
            download(ctx, opts, &f, bound, dir.join(format!("src-{i}.parquet"))).await
        })
        .buffered(parallelism)
        .collect::<Vec<Result<PathBuf>>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    tracing::debug!(
        ms = t.elapsed().as_millis() as u64,
        files = m.files.len(),
        "compact step download"
    );
    Ok((sources, spill))
}

/// Step 2: the system-column check of every source, and the merge into `merged` (DuckDB, on
/// a blocking thread). DuckDB spills at most `spill` bytes: what step 1's free-space check left
/// beside the sources and the merged file, so a source that decompresses to far more than it
/// weighs fails the merge instead of filling the disk (docs/hazards.md S2).
async fn merge(
    opts: &CompactOptions,
    sources: Vec<PathBuf>,
    spill: Option<u64>,
    merged: PathBuf,
) -> Result<Merged> {
    let t = Instant::now();
    let cfg = EngineConfig {
        max_spill_bytes: spill,
        ..opts.engine.clone()
    };
    let out = tokio::task::spawn_blocking(move || -> Result<Merged> {
        let mut rows_in = 0u64;
        for s in &sources {
            let rows = u64::try_from(footer::check_file(s)?.row_count).unwrap_or(0);
            rows_in = rows_in.saturating_add(rows);
        }
        let engine = Engine::open(&cfg)?;
        let stats = engine.merge(&sources, &merged)?;
        let info = footer::check_file(&merged)?;
        Ok(Merged {
            rows_in,
            stats,
            columns: info.columns,
        })
    })
    .await
    .map_err(Error::task("merge"))??;
    tracing::debug!(ms = t.elapsed().as_millis() as u64, "compact step merge");
    Ok(out)
}

/// A new base staged at its final key, not yet listed.
struct StagedBase {
    key: String,
    staged: job::Staged,
}

/// Step 3: the merged file uploaded and promoted to a new UUID-named base key.
async fn stage_base(p: &Pass<'_>, merged: &std::path::Path) -> Result<StagedBase> {
    let t = Instant::now();
    let (store, layout) = (p.ctx.lake.store.as_ref(), &p.ctx.lake.layout);
    let key = layout.merged_base_key(p.schema_id, Uuid::now_v7());
    let ops = ("upload merged base", "promote merged base");
    let clock = p.ctx.clock.as_ref();
    let staged = job::stage(store, layout, clock, p.schema_id, merged, &key, ops).await?;
    tracing::debug!(ms = t.elapsed().as_millis() as u64, "compact step upload");
    Ok(StagedBase { key, staged })
}

/// Step 4: one conditional save lists the new base in place of its sources and retires them.
/// Refused when the base outlived its lease (gc may already treat it as an orphan) or when a
/// source left the manifest meanwhile (the pass is retried); a save that certainly did not land
/// deletes the staged base.
async fn splice(
    p: &Pass<'_>,
    ownership: &owner::Ownership,
    m: &Manifest,
    merged: &Merged,
    base: StagedBase,
    out: &mut SchemaCompact,
) -> Result<(), PassError> {
    let (ctx, opts, schema_id) = (p.ctx, p.opts, p.schema_id);
    let (store, layout) = (ctx.lake.store.as_ref(), &ctx.lake.layout);
    let (stats, put) = (&merged.stats, &base.staged.put);
    let merged_paths: BTreeSet<String> = m.files.iter().map(|f| f.path.clone()).collect();
    let entry = FileEntry {
        tier: Tier::Base,
        path: base.key.clone(),
        row_id_min: stats.row_id_min.clone().unwrap_or_default(),
        row_id_max: stats.row_id_max.clone().unwrap_or_default(),
        created_min: stats.changed_min,
        created_max: stats.changed_max,
        size_bytes: i64::try_from(put.size).unwrap_or(i64::MAX),
        row_count: i64::try_from(stats.rows_out).unwrap_or(i64::MAX),
        checksum: Some(put.checksum()),
        columns: Some(merged.columns.iter().cloned().collect()),
        extra: Default::default(),
    };
    let mut vanished: Option<String> = None;
    let policy = CommitPolicy {
        max_attempts: opts.max_retries.max(1),
        ..CommitPolicy::default()
    };
    // An unclaimed prefix is claimed at publish time, so a failed pass leaves no claim.
    let committed = owner::claim_and_commit(
        store,
        layout,
        schema_id,
        &out.schema,
        ownership,
        ctx.clock.as_ref(),
        policy,
        |m| {
            check_lease(p, &base)?;
            let listed: BTreeSet<&String> = m.files.iter().map(|f| &f.path).collect();
            if let Some(gone) = merged_paths.iter().find(|p| !listed.contains(p)) {
                vanished = Some(gone.clone());
                return Err(Error::Manifest {
                    key: layout.manifest_key(schema_id),
                    message: format!("{gone} is no longer listed"),
                });
            }
            m.files.retain(|f| !merged_paths.contains(&f.path));
            m.files.push(entry.clone());
            // Stamped at this attempt: gc's grace for the sources starts when they are unlisted.
            m.retire(&merged_paths, ctx.clock.now_ms());
            Ok(())
        },
    )
    .await;
    match committed {
        Ok(_) => {
            out.files_out = 1;
            out.rows_out = stats.rows_out;
            out.bytes_out = put.size;
            out.new_base = Some(base.key);
            Ok(())
        }
        Err(Error::AmbiguousCommit { key, source }) => {
            Err(PassError::Fail(Error::AmbiguousPublish {
                key,
                object: base.key,
                source,
            }))
        }
        Err(e) => {
            // Provably not committed: the staged base is unlisted garbage now.
            delete_or_leave(store, &base.key, "staged base").await;
            match vanished {
                Some(path) => Err(PassError::Retry(format!(
                    "{path} left the manifest meanwhile"
                ))),
                None => Err(PassError::Fail(e)),
            }
        }
    }
}

/// Refuses to list a base staged longer ago than the commit lease. The lease starts before the
/// copy creates the base (gc ages objects by their creation) and is measured on both clocks:
/// the monotonic one does not count a suspended host (gc on another host keeps counting), the
/// wall clock can jump; the longer age counts.
fn check_lease(p: &Pass<'_>, base: &StagedBase) -> Result<()> {
    let since_ms = p
        .ctx
        .clock
        .now_ms()
        .saturating_sub(base.staged.promoted_at_ms);
    let wall = Duration::from_millis(u64::try_from(since_ms).unwrap_or(0));
    let mono = base.staged.promoted_at.elapsed();
    if mono.max(wall) > p.opts.commit_lease {
        return Err(Error::LeaseExpired {
            key: base.key.clone(),
            staged_s: mono.as_secs(),
            wall_s: wall.as_secs(),
            lease_s: p.opts.commit_lease.as_secs(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_dirs_free_space_is_measured() {
        let dir = tempfile::tempdir().unwrap();
        let free = available_bytes(dir.path()).unwrap();
        assert!(free > 0 && free < u64::MAX, "{free}");
        assert!(available_bytes(&dir.path().join("missing")).is_err());
        assert!(CompactOptions::default().free_space.is_some());
    }

    fn entry(tier: Tier, rows: i64, bytes: i64) -> FileEntry {
        FileEntry {
            tier,
            path: format!("p{rows}"),
            row_id_min: String::new(),
            row_id_max: String::new(),
            created_min: 0,
            created_max: 0,
            size_bytes: bytes,
            row_count: rows,
            checksum: None,
            columns: None,
            extra: Default::default(),
        }
    }

    fn manifest(files: Vec<FileEntry>) -> Manifest {
        Manifest {
            files,
            ..Manifest::empty(7)
        }
    }

    #[test]
    fn a_work_dir_without_room_for_the_sources_and_the_merge_is_refused() {
        let dir = Path::new("/srv/work");
        assert!(check_work_dir_space(dir, "compaction", 100, 100).is_ok());
        let err = check_work_dir_space(dir, "compaction", 101, 100).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::NoSpace {
                    needed: 101,
                    free: 100,
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("/srv/work has 100 bytes free"), "{msg}");
        assert!(msg.contains("compaction needs 101"), "{msg}");
    }

    #[test]
    fn decisions() {
        let opts = CompactOptions {
            target_base_size: 1000,
            ..CompactOptions::default()
        };
        let d = |files| plan(&manifest(files), &opts).decision;
        assert_eq!(d(vec![]), Decision::Noop);
        assert_eq!(d(vec![entry(Tier::Base, 100, 10)]), Decision::Noop);
        assert_eq!(
            d(vec![entry(Tier::Delta, 5, 999)]),
            Decision::Noop,
            "no base, small deltas"
        );
        assert_eq!(d(vec![entry(Tier::Delta, 5, 1000)]), Decision::Promote);
        assert_eq!(
            d(vec![entry(Tier::Base, 100, 10), entry(Tier::Delta, 5, 10)]),
            Decision::Noop
        );
        assert_eq!(
            d(vec![entry(Tier::Base, 100, 10), entry(Tier::Delta, 6, 10)]),
            Decision::Rewrite
        );
        // Promotion wins over rewrite.
        assert_eq!(
            d(vec![
                entry(Tier::Base, 100, 10),
                entry(Tier::Delta, 60, 5000)
            ]),
            Decision::Promote
        );
        let p = plan(
            &manifest(vec![entry(Tier::Base, 100, 10), entry(Tier::Delta, 6, 10)]),
            &opts,
        );
        assert_eq!((p.base_rows, p.delta_rows, p.delta_files), (100, 6, 1));
        assert!((p.dirty_ratio - 0.06).abs() < 1e-9);
        assert!(p.reason.contains("--dirty-ratio"), "{}", p.reason);
    }
}
