//! `lakecdc compact`: keeps the base tier a set of disjoint row-id ranges, rewriting only the
//! ranges the deltas touch enough, and folds the rest of the deltas into one consolidated
//! delta (docs/design.md §4.3, §9).
//!
//! No advisory lock: the manifest's conditional write is the only fence, so a flush may run at
//! the same time. A plain-data [`Plan`] decides first (`noop`, `promote`, `rewrite`,
//! `consolidate`, with the ranges and their delta shares behind it): the deltas' `row_id`
//! columns are read to count their rows per base range ([`touched`]); `--dry-run` and
//! `inspect` print that plan. A rewrite or consolidation then:
//!
//! 1. reads the footer of every source (the rewritten ranges' bases and every delta) with
//!    ranged reads: one larger than its entry lists is refused (docs/hazards.md S2), every one
//!    must carry the system columns;
//! 2. streams the sources row group by row group through a k-way merge (`merge`), hashing
//!    every byte against the manifest's checksum (`input`; a mismatch refuses the schema and
//!    names the object, unless `--skip-input-checksum-verify`); new bases are cut at
//!    `--target-base-size` and each is uploaded straight to `base-{uuidv7}.parquet` (the
//!    consolidated delta straight to a delta key) as soon as it is complete (`output`), so
//!    local disk holds at most two outputs, never the schema;
//! 3. ONE conditional manifest save removes exactly the merged paths, adds the new files and
//!    records the merged paths under `retired` (for gc). A concurrent flush's delta stays
//!    listed: on a confirmed conflict the splice is re-applied to the fresh manifest. If a
//!    merged path is no longer listed (another compaction or init won), the staged files —
//!    provably unlisted — are deleted and the whole pass retried with backoff.
//!
//! Every listed path must be a data file of the schema before any of this (a dry run included):
//! a foreign one is refused and never requested (docs/hazards.md #417, S1). Sources are never
//! deleted here; gc removes retired files after its grace period, when no in-flight reader can
//! still be opening them (docs/hazards.md #461).

mod merge;
mod output;
mod pages;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use serde::Serialize;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::engine::EngineConfig;
use crate::error::{Error, Result};
use crate::job;
use crate::lake::manifest::{self, CommitPolicy, FileEntry, Manifest, SaveFrom, Tier};
use crate::lake::owner;
use crate::lake::ranges::{self, Ranges, parse_key};
use crate::lake::streamed::{self, Source};
use crate::lake::{Layout, SourceGuard};
use crate::report::label;
use crate::retry::Backoff;
use crate::source::registry::Registered;
use crate::store::stream as stream_parts;
use crate::store::{ObjectStore, delete_or_leave};

pub use crate::engine::parallel::MIN_REPEAT_ROWS;
/// Compact runs with the shared lake-job context.
pub use crate::job::Context;
pub use crate::job::{FreeSpace, available_bytes, check_work_dir_space};
pub use crate::policy::{CompactThresholds, Decision, Plan};

/// A test seam called after the new files are staged, before the manifest save; only
/// [`run_with_hook`] (the `testing` feature) takes one.
pub type Hook = Arc<dyn Fn(i16) -> BoxFuture<'static, ()> + Send + Sync>;

/// Compact options (defaults as in docs/design.md §4.3).
#[derive(Debug, Clone)]
pub struct CompactOptions {
    /// Schema names or ids; empty = every registered schema.
    pub schemas: Vec<String>,
    /// The most bytes a base file may hold (docs/design.md §9).
    pub target_base_size: u64,
    /// Rewrite a base range once delta rows in it / its rows reach this share.
    pub dirty_ratio: f64,
    /// Fold the deltas into one once more than this many are listed.
    pub max_deltas: usize,
    /// The most bytes a pass reads (every delta and the bases of the ranges it rewrites):
    /// ranges past the ratio beyond it wait for a later pass, so that a pass ends within
    /// the commit lease (docs/design.md §9).
    pub max_rewrite_bytes: u64,
    /// New bases line up with the row groups of rewritten bases that hold at least this many
    /// rows, so that a row group a pass changes few rows of keeps its unchanged column chunks
    /// as they are (docs/design.md §9); [`MIN_REPEAT_ROWS`] by default.
    pub min_repeat_rows: usize,
    /// Merge even when a source's bytes do not match its checksum.
    pub skip_input_checksum_verify: bool,
    /// Whole-pass retries after a lost race.
    pub max_retries: u32,
    /// Print the plan only.
    pub dry_run: bool,
    /// Where the output files are written before their upload.
    pub work_dir: PathBuf,
    /// DuckDB settings (compaction itself does not use DuckDB; kept for the shared flags).
    pub engine: EngineConfig,
    /// Footers read at once.
    pub download_parallelism: usize,
    /// The longest a new base may wait between being staged and being listed (see
    /// [`job::COMMIT_LEASE`]).
    pub commit_lease: Duration,
    /// Measures the work dir's free space before a rewrite writes anything
    /// ([`check_work_dir_space`]; [`available_bytes`] by default); `None` leaves it unmeasured.
    pub free_space: Option<FreeSpace>,
}

impl CompactOptions {
    /// The numbers the compaction decision is made from.
    pub fn thresholds(&self) -> CompactThresholds {
        CompactThresholds {
            target_base_size: self.target_base_size,
            dirty_ratio: self.dirty_ratio,
            max_deltas: self.max_deltas,
            max_rewrite_bytes: self.max_rewrite_bytes,
        }
    }
}

impl Default for CompactOptions {
    fn default() -> Self {
        Self {
            schemas: Vec::new(),
            target_base_size: 256 * 1024 * 1024,
            dirty_ratio: 0.05,
            max_deltas: 32,
            max_rewrite_bytes: crate::policy::MAX_REWRITE_BYTES,
            min_repeat_rows: MIN_REPEAT_ROWS,
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
    /// Rows in the new files.
    pub rows_out: u64,
    /// Bytes of the new files.
    pub bytes_out: u64,
    /// The first new base's key.
    pub new_base: Option<String>,
    /// Every new file's key (bases, then the consolidated delta).
    pub new_files: Vec<String>,
    /// Base files merged and retired.
    pub bases_rewritten: usize,
    /// Base files left as they were.
    pub bases_kept: usize,
    /// The most bytes the pass's output files held on local disk at once.
    pub scratch_peak_bytes: u64,
    /// Column chunks copied from rewritten bases into the new ones as they were, unencoded:
    /// the unchanged columns of row groups that came out row for row as they went in.
    pub chunks_copied: usize,
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
            new_files: Vec::new(),
            bases_rewritten: 0,
            bases_kept: 0,
            scratch_peak_bytes: 0,
            chunks_copied: 0,
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
            if let Some(line) = s.plan.as_ref().and_then(Plan::ranges_line) {
                out.push_str(&format!("    {line}\n"));
            }
            for b in &s.new_files {
                out.push_str(&format!("    new {}\n", crate::report::printable(b, false)));
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
    // Every column chunk read or written opens zstd contexts and frees them: glibc keeps the
    // freed memory for the next one (src/allocator.rs).
    let kept = crate::allocator::keep_freed_memory();
    tracing::debug!(kept, "compact: allocator keeps freed memory");
    let (scratch, engine) = job::scratch(&opts.work_dir, &opts.engine)?;
    let opts = &CompactOptions {
        work_dir: scratch.path().to_path_buf(),
        engine,
        ..opts.clone()
    };
    let source = &job::source_guard(ctx).await?;
    let schemas = job::each_schema(
        ctx,
        &opts.schemas,
        |reg| {
            let hook = hook.clone();
            async move { compact_schema(ctx, opts, source, hook, &reg).await }
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
        exit_code = report.exit_code(),
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
    source: &SourceGuard,
    hook: Option<Hook>,
    reg: &Registered,
) -> SchemaCompact {
    let started = Instant::now();
    let mut out = SchemaCompact::new(reg);
    let policy = CommitPolicy::default();
    loop {
        // Each pass reports what it did alone: a lost attempt's counts are not the outcome's.
        out = SchemaCompact {
            attempts: out.attempts + 1,
            ..SchemaCompact::new(reg)
        };
        let p = Pass {
            ctx,
            opts,
            source,
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
                let error = format!("gave up after {} passes: {why}", out.attempts);
                out.outcome = Outcome::Failed;
                out.error = Some(job::failed("compaction", &reg.name, error));
                break;
            }
            Err(PassError::Fail(e)) => {
                out.outcome = Outcome::Failed;
                out.error = Some(job::failed("compaction", &reg.name, e.chain()));
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
    /// The database this run reads: a lake written from another is refused.
    source: &'a SourceGuard,
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
    p.source.check(&key, loaded.manifest.source.as_ref())?;
    let (ranges, plan) = plan(
        store,
        layout,
        schema_id,
        &loaded.manifest,
        &opts.thresholds(),
    )
    .await?;
    out.plan = Some(plan.clone());
    out.bases_kept = plan.base_files;
    if plan.decision == Decision::Noop {
        return Ok(());
    }
    // Its bases live in the data prefix: the prefix must be this manifest's (a dry run checks;
    // a real pass claims an unclaimed one when it publishes).
    let ownership = owner::check_writable(store, &ctx.lake.layout, schema_id).await?;
    if opts.dry_run {
        planned_counts(out, &plan, &ranges);
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
                p.source,
                ctx.clock.as_ref(),
                CommitPolicy::default(),
                SaveFrom::default(),
                |m| {
                    for f in m.files.iter_mut().filter(|f| deltas.contains(&f.path)) {
                        f.tier = Tier::Base;
                    }
                    Ok(())
                },
            )
            .await?;
            // Promoted in place: the deltas are listed as bases, no file is written.
            out.files_in = deltas.len();
            Ok(())
        }
        Decision::Rewrite | Decision::Consolidate => {
            let dir = opts
                .work_dir
                .join(format!("lakecdc-compact-{}", Uuid::new_v4()));
            crate::scratch::create_dir(&dir).map_err(|source| Error::Io {
                op: "create work dir",
                path: dir.clone(),
                source,
            })?;
            let res = rewrite(p, &ownership, &loaded.manifest, &ranges, &plan, &dir, out).await;
            let _ = tokio::fs::remove_dir_all(&dir).await;
            res
        }
    }
}

/// What a dry run reports as done: the counts the pass it plans reports once it is done (the
/// files and rows of the rewritten ranges and of the deltas, from the manifest's entries).
fn planned_counts(out: &mut SchemaCompact, plan: &Plan, ranges: &Ranges) {
    match plan.decision {
        Decision::Noop => {}
        Decision::Promote => out.files_in = plan.delta_files,
        Decision::Rewrite | Decision::Consolidate => {
            let rewritten = plan.rewrite.iter().map(|r| r.files).sum::<usize>();
            out.bases_rewritten = rewritten + ranges.empty_files().len();
            out.bases_kept = plan.bases_kept;
            out.files_in = out.bases_rewritten + plan.delta_files;
            let rows = plan.rewrite.iter().map(|r| r.rows).sum::<i64>() + plan.delta_rows;
            out.rows_in = u64::try_from(rows).unwrap_or(0);
        }
    }
}

/// Plans a compaction of a schema's manifest (what `--dry-run` and `inspect` print): its base
/// ranges and the deltas' rows in each ([`ranges::survey`]), then the decision.
pub async fn plan(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    m: &Manifest,
    thresholds: &CompactThresholds,
) -> Result<(Ranges, Plan)> {
    let (ranges, touched) = ranges::survey(store, layout, schema_id, m).await?;
    let plan = thresholds.plan(m, &ranges, &touched);
    Ok((ranges, plan))
}

/// A new file staged at its final key, not yet listed.
struct StagedFile {
    key: String,
    entry: FileEntry,
    staged: job::Staged,
}

/// What the merge of a pass produced.
struct Produced {
    counts: merge::Counts,
    totals: output::Totals,
    staged: Vec<StagedFile>,
}

/// Rewrites the planned ranges and folds every other delta row into one consolidated delta
/// (docs/design.md §9): (1) read every source's footer, (2) stream, merge and write, each
/// output uploaded as soon as it is complete, (3) splice them into the manifest in place of
/// the sources, which are retired for gc. A failure deletes what was staged.
async fn rewrite(
    p: &Pass<'_>,
    ownership: &owner::Ownership,
    m: &Manifest,
    ranges: &Ranges,
    plan: &Plan,
    dir: &Path,
    out: &mut SchemaCompact,
) -> Result<(), PassError> {
    let store = p.ctx.lake.store.as_ref();
    let mut rewrite = vec![false; ranges.slots()];
    for r in &plan.rewrite {
        if let Some(slot) = rewrite.get_mut(r.index) {
            *slot = true;
        }
    }
    // The sources: the rewritten ranges' bases in row-id order, then every delta.
    let mut inputs: Vec<FileEntry> = Vec::new();
    for (i, r) in ranges.ranges().iter().enumerate() {
        if rewrite[i] {
            inputs.extend(
                m.files
                    .iter()
                    .filter(|f| r.files.contains(&f.path))
                    .cloned(),
            );
        }
    }
    let bases_in = inputs.len();
    inputs.extend(m.tier(Tier::Delta).cloned());
    let mut merged_paths: BTreeSet<String> = inputs.iter().map(|f| f.path.clone()).collect();
    merged_paths.extend(ranges.empty_files().iter().cloned());
    check_room(p.opts, &inputs, dir)?;
    let t = Instant::now();
    let parallelism = p.opts.download_parallelism.max(1);
    // The streams: the rewritten bases in as few chains of disjoint files as their ranges
    // allow (one, unless bases written before ranged compaction overlap), then one per delta.
    let chains = chains(&inputs, bases_in);
    let mut head = vec![false; inputs.len()];
    for c in &chains {
        if let Some(&first) = c.first() {
            head[first] = true;
        }
    }
    // Every source's footer is read and checked before anything is merged. A stream's first
    // file is kept open; of the others only the schema is kept, and the stream opens them again
    // when it reaches them, so memory does not grow with the number of bases.
    let opened: Vec<(FileEntry, SchemaRef, Option<Arc<Source>>)> =
        stream::iter(inputs.into_iter().zip(head))
            .map(|(f, head)| async move {
                let src = streamed::open(store, &f).await?;
                let schema = src.arrow.schema().clone();
                Ok::<_, Error>((f, schema, head.then(|| Arc::new(src))))
            })
            .buffered(parallelism)
            .collect::<Vec<Result<_>>>()
            .await
            .into_iter()
            .collect::<Result<_>>()?;
    tracing::debug!(
        ms = t.elapsed().as_millis() as u64,
        files = opened.len(),
        "compact step footers"
    );
    let mut schemas: Vec<(FileEntry, SchemaRef)> = Vec::with_capacity(opened.len());
    let mut heads: Vec<Option<Arc<Source>>> = Vec::with_capacity(opened.len());
    for (f, s, src) in opened {
        schemas.push((f, s));
        heads.push(src);
    }
    let schema = merge::merged_schema(&schemas)?;
    let streams: Vec<Vec<streamed::Opening>> = chains
        .iter()
        .map(|c| {
            c.iter()
                .map(|&i| match heads[i].take() {
                    Some(s) => streamed::Opening::Open(s),
                    None => streamed::Opening::Later(schemas[i].0.clone()),
                })
                .collect()
        })
        .collect();
    drop(schemas);
    out.files_in = merged_paths.len();
    // Nothing would be left listed: a zero-row base keeps the tier (docs/hazards.md #519).
    let zero_row_base = plan.bases_kept == 0;
    let produced = produce(p, ranges, rewrite, streams, schema, zero_row_base, dir).await;
    let produced = match produced {
        Ok(x) => x,
        Err((e, staged)) => {
            for key in staged {
                delete_or_leave(store, &key, "staged compaction output").await;
            }
            return Err(e.into());
        }
    };
    out.rows_in = produced.counts.rows_in;
    out.scratch_peak_bytes = produced.totals.scratch_peak;
    out.chunks_copied = produced.totals.copied_chunks;
    out.bases_rewritten = bases_in + ranges.empty_files().len();
    out.bases_kept = plan.bases_kept;
    if let Some(h) = &p.hook {
        h(p.schema_id).await;
    }
    splice(p, ownership, merged_paths, produced.staged, out).await
}

/// The streams of a rewrite, as positions in `inputs` (the rewritten ranges' `bases` first, in
/// row-id order, then the deltas): the bases in as few chains of disjoint files as their
/// ranges allow (one, unless bases written before ranged compaction overlap), then one per
/// delta.
fn chains(inputs: &[FileEntry], bases: usize) -> Vec<Vec<usize>> {
    let mut chains: Vec<Vec<usize>> = Vec::new();
    for (i, b) in inputs.iter().enumerate().take(bases) {
        let min = parse_key(&b.row_id_min);
        let fits = chains.iter_mut().find(|c| {
            let last = c
                .last()
                .and_then(|&l| inputs.get(l))
                .and_then(|l| parse_key(&l.row_id_max));
            matches!((last, min), (Some(l), Some(m)) if l < m)
        });
        match fits {
            Some(c) => c.push(i),
            None => chains.push(vec![i]),
        }
    }
    chains.extend((bases..inputs.len()).map(|i| vec![i]));
    chains
}

/// Whether the work dir has room for what a pass writes locally: at most two base files of
/// the target size (one written, one uploaded, never more than the sources hold). The
/// consolidated delta is streamed to the store, never written locally.
fn check_room(opts: &CompactOptions, inputs: &[FileEntry], dir: &Path) -> Result<()> {
    let Some(measure) = opts.free_space else {
        return Ok(());
    };
    let bytes = |tier: Tier| {
        Manifest::total_bytes(inputs.iter().filter(|f| f.tier == tier))
            .max(0)
            .unsigned_abs()
    };
    let needed = opts
        .target_base_size
        .saturating_mul(2)
        .min(bytes(Tier::Base).saturating_add(bytes(Tier::Delta)));
    let free = measure(dir).map_err(|source| Error::Io {
        op: "measure free space of work dir",
        path: dir.to_path_buf(),
        source,
    })?;
    check_work_dir_space(dir, "compaction (its output files)", needed, free)
}

/// Step 2: the merge on one blocking thread, the writer on another, the sources streamed and
/// the outputs staged by tasks. On failure, returns the keys of what was staged so far (to
/// delete).
#[allow(clippy::too_many_arguments)]
async fn produce(
    p: &Pass<'_>,
    ranges: &Ranges,
    rewrite: Vec<bool>,
    streams: Vec<Vec<streamed::Opening>>,
    schema: SchemaRef,
    zero_row_base: bool,
    dir: &Path,
) -> std::result::Result<Produced, (Error, Vec<String>)> {
    let t = Instant::now();
    let store = p.ctx.lake.store.clone();
    let mut cursors = Vec::with_capacity(streams.len());
    let mut pumps = Vec::with_capacity(streams.len());
    for chain in streams {
        let (tx, rx) = mpsc::channel(2);
        cursors.push(streamed::Cursor::new(rx, chain.len()));
        pumps.push(tokio::spawn(streamed::pump(
            store.clone(),
            chain,
            p.opts.skip_input_checksum_verify,
            tx,
        )));
    }
    let (done_tx, mut done_rx) = mpsc::channel::<output::Done>(1);
    let (ack_tx, ack_rx) = std::sync::mpsc::channel::<()>();
    let (msg_tx, msg_rx) = std::sync::mpsc::sync_channel::<output::Msg>(4);
    let outputs = output::Outputs::new(
        dir,
        schema.clone(),
        p.opts.target_base_size,
        done_tx,
        ack_rx,
    );
    let writer = tokio::task::spawn_blocking(move || outputs.serve(msg_rx));
    let ranges_owned = ranges.clone();
    let min_repeat = p.opts.min_repeat_rows;
    let merger = tokio::task::spawn_blocking(move || {
        merge::Merge::new(&ranges_owned, &rewrite, min_repeat, schema, msg_tx)
            .run(cursors, zero_row_base)
    });
    // Stage each finished output as it arrives; a streamed one's upload runs from its start.
    let mut staged: Vec<StagedFile> = Vec::new();
    let mut upload_error: Option<Error> = None;
    let mut streaming: Option<Streaming> = None;
    while let Some(done) = done_rx.recv().await {
        let res = match done {
            output::Done::Streaming(kind, parts) => {
                streaming = Some(start_streamed(p, kind, parts));
                continue;
            }
            output::Done::Finished(w) => match &w.path {
                Some(path) => {
                    let key = new_key(p, w.kind);
                    let clock = p.ctx.clock.as_ref();
                    let res =
                        job::upload(store.as_ref(), clock, path, &key, upload_op(w.kind)).await;
                    let _ = tokio::fs::remove_file(path).await;
                    let _ = ack_tx.send(());
                    res.map(|s| staged_file(key, &w, s))
                }
                None => match streaming.take() {
                    Some((key, kind, task)) => {
                        joined(kind, task).await.map(|s| staged_file(key, &w, s))
                    }
                    None => Err(Error::Invariant(
                        "a streamed output finished that never started".into(),
                    )),
                },
            },
        };
        match res {
            Ok(s) => staged.push(s),
            Err(e) => {
                upload_error = Some(e);
                break;
            }
        }
    }
    drop(done_rx);
    drop(ack_tx);
    let merged = merger.await.map_err(Error::task("merge"));
    let written = writer
        .await
        .map_err(Error::task("write compaction outputs"));
    for pump in pumps {
        pump.abort();
    }
    // A streamed upload still under way when the writer stopped: its failure explains the
    // writer's (its writes failed with it); one the writer abandoned stored nothing; one that
    // completed anyway is deleted with the other staged outputs.
    let mut unreported: Option<String> = None;
    if let Some((key, kind, task)) = streaming.take() {
        match joined(kind, task).await {
            Ok(_) => unreported = Some(key),
            Err(Error::Storage {
                source: crate::store::StoreError::Unfinished,
                ..
            }) => {}
            Err(e) => {
                upload_error.get_or_insert(e);
            }
        }
    }
    tracing::debug!(ms = t.elapsed().as_millis() as u64, "compact step merge");
    // The merge's own error explains a writer that stopped for it, so it comes before the
    // writer's.
    let outcome = match upload_error {
        Some(e) => Err(e),
        None => merged
            .and_then(|m| m)
            .and_then(|counts| written.and_then(|w| w).map(|totals| (counts, totals))),
    };
    match outcome {
        Ok((counts, totals)) => Ok(Produced {
            counts,
            totals,
            staged,
        }),
        Err(e) => Err((
            e,
            staged
                .into_iter()
                .map(|s| s.key)
                .chain(unreported)
                .collect(),
        )),
    }
}

/// A streamed output's key, kind and upload task.
type Streaming = (
    String,
    output::Kind,
    tokio::task::JoinHandle<Result<job::Staged>>,
);

/// A new output's final key: a new base's `base-{uuidv7}.parquet`, the consolidated delta's a
/// delta key (docs/design.md §4.3).
fn new_key(p: &Pass<'_>, kind: output::Kind) -> String {
    let layout = &p.ctx.lake.layout;
    match kind {
        output::Kind::Base => layout.merged_base_key(p.schema_id, Uuid::now_v7()),
        output::Kind::Delta => layout.delta_key(p.schema_id, Uuid::now_v7()),
    }
}

/// The step an output's upload is named by in errors.
fn upload_op(kind: output::Kind) -> &'static str {
    match kind {
        output::Kind::Base => "upload merged base",
        output::Kind::Delta => "upload consolidated delta",
    }
}

/// Starts storing a streamed output straight to its final key as it is written (docs/design.md
/// §9); its lease starts now.
fn start_streamed(p: &Pass<'_>, kind: output::Kind, parts: stream_parts::Parts) -> Streaming {
    let key = new_key(p, kind);
    let started = (Instant::now(), p.ctx.clock.now_ms());
    let store = p.ctx.lake.store.clone();
    let to = key.clone();
    let task = tokio::spawn(async move {
        job::upload_parts(store.as_ref(), started, parts, &to, upload_op(kind)).await
    });
    (key, kind, task)
}

/// A streamed output's upload, once it ended.
async fn joined(
    kind: output::Kind,
    task: tokio::task::JoinHandle<Result<job::Staged>>,
) -> Result<job::Staged> {
    task.await
        .map_err(Error::task(upload_op(kind)))
        .and_then(|r| r)
}

/// The manifest entry of an uploaded output.
fn staged_file(key: String, w: &output::Written, staged: job::Staged) -> StagedFile {
    let tier = match w.kind {
        output::Kind::Base => Tier::Base,
        output::Kind::Delta => Tier::Delta,
    };
    let (row_id_min, row_id_max) = match w.keys {
        Some((lo, hi)) => (ranges::key_text(lo), ranges::key_text(hi)),
        None => (String::new(), String::new()),
    };
    let entry = FileEntry {
        tier,
        path: key.clone(),
        row_id_min,
        row_id_max,
        created_min: w.changed.0,
        created_max: w.changed.1,
        size_bytes: i64::try_from(staged.put.size).unwrap_or(i64::MAX),
        row_count: i64::try_from(w.rows).unwrap_or(i64::MAX),
        checksum: Some(staged.put.checksum()),
        columns: Some(w.columns.iter().cloned().collect()),
        extra: Default::default(),
    };
    StagedFile { key, entry, staged }
}

/// Conditional writes a splice tries against other writers' saves; with backoffs of at most
/// 2 s that is a few minutes, and the lease (checked by every attempt) ends it sooner.
const SPLICE_ATTEMPTS: u32 = 100;

/// Step 3: one conditional save lists the new files in place of their sources and retires
/// them. Refused when a new file outlived its lease (gc may already treat it as an orphan) or
/// when a source left the manifest meanwhile (the pass is retried); a save that certainly did
/// not land deletes the staged files.
async fn splice(
    p: &Pass<'_>,
    ownership: &owner::Ownership,
    merged_paths: BTreeSet<String>,
    staged: Vec<StagedFile>,
    out: &mut SchemaCompact,
) -> Result<(), PassError> {
    let (ctx, opts, schema_id) = (p.ctx, p.opts, p.schema_id);
    let (store, layout) = (ctx.lake.store.as_ref(), &ctx.lake.layout);
    let mut vanished: Option<String> = None;
    // Another writer's save between the read and the conditional write (a flush saves every
    // batch) only means the splice is re-applied to the newer manifest, which stays correct
    // while every source is listed and the lease holds (both checked by each attempt): the
    // merged work is not thrown away after a handful of busy saves (docs/hazards.md L109).
    let policy = CommitPolicy {
        max_attempts: SPLICE_ATTEMPTS.max(opts.max_retries),
        ..CommitPolicy::default()
    };
    // An unclaimed prefix is claimed at publish time, so a failed pass leaves no claim.
    let committed = owner::claim_and_commit(
        store,
        layout,
        schema_id,
        &out.schema,
        ownership,
        p.source,
        ctx.clock.as_ref(),
        policy,
        SaveFrom::default(),
        |m| {
            for s in &staged {
                check_lease(p, &s.key, &s.staged)?;
            }
            let listed: BTreeSet<&String> = m.files.iter().map(|f| &f.path).collect();
            if let Some(gone) = merged_paths.iter().find(|p| !listed.contains(p)) {
                vanished = Some(gone.clone());
                return Err(Error::Manifest {
                    key: layout.manifest_key(schema_id),
                    message: format!("{gone} is no longer listed"),
                });
            }
            m.files.retain(|f| !merged_paths.contains(&f.path));
            m.files.extend(staged.iter().map(|s| s.entry.clone()));
            // Stamped at this attempt: gc's grace for the sources starts when they are unlisted.
            m.retire(&merged_paths, ctx.clock.now_ms());
            Ok(())
        },
    )
    .await;
    match committed {
        Ok(_) => {
            out.files_out = staged.len();
            out.rows_out = staged
                .iter()
                .map(|s| s.entry.row_count.max(0).unsigned_abs())
                .sum();
            out.bytes_out = staged.iter().map(|s| s.staged.put.size).sum();
            out.new_base = staged
                .iter()
                .find(|s| s.entry.tier == Tier::Base)
                .map(|s| s.key.clone());
            out.new_files = staged.iter().map(|s| s.key.clone()).collect();
            Ok(())
        }
        Err(Error::AmbiguousCommit { key, source }) => {
            Err(PassError::Fail(Error::AmbiguousPublish {
                key,
                object: staged
                    .iter()
                    .map(|s| s.key.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                source,
            }))
        }
        Err(e) => {
            // Provably not committed: the staged files are unlisted garbage now.
            for s in &staged {
                delete_or_leave(store, &s.key, "staged compaction output").await;
            }
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
/// upload (or the copy) creates the file (gc ages objects by their creation) and is measured
/// on both clocks: the monotonic one does not count a suspended host (gc on another host keeps
/// counting), the wall clock can jump; the longer age counts.
fn check_lease(p: &Pass<'_>, key: &str, staged: &job::Staged) -> Result<()> {
    let since_ms = p.ctx.clock.now_ms().saturating_sub(staged.uploaded_at_ms);
    let wall = Duration::from_millis(u64::try_from(since_ms).unwrap_or(0));
    let mono = staged.uploaded_at.elapsed();
    if mono.max(wall) > p.opts.commit_lease {
        return Err(Error::LeaseExpired {
            key: key.to_string(),
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
}
