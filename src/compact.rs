//! `lakecdc compact`: promotes or merges deltas into UUID-named bases (DESIGN §4.3).
//!
//! No advisory lock: the manifest's conditional write is the only fence, so a flush may run at
//! the same time. A plain-data [`Plan`] decides first (`noop`, `promote`, `rewrite`, with the
//! numbers behind it); `--dry-run` prints it. Side effects of a rewrite, in order:
//!
//! 1. download every listed file to the work dir, hashing while downloading; a checksum
//!    mismatch refuses the schema and names the object (unless `--skip-input-checksum-verify`);
//!    every file must carry the system columns;
//! 2. DuckDB merges them (latest `changed_at` per `row_id`, a tombstone wins a tie, tombstones
//!    dropped) into one file sorted by `row_id` — zero survivors still make a zero-row base;
//! 3. upload to `_tmp/`, promote to `base-{uuidv7}.parquet`, delete the tmp;
//! 4. ONE conditional manifest save that removes exactly the merged paths, adds the new base and
//!    records the merged paths under `retired` (for gc). A concurrent flush's delta stays
//!    listed: on a confirmed conflict the splice is re-applied to the fresh manifest. If a merged
//!    path is no longer listed (another compaction or init won), the staged base — provably
//!    unlisted — is deleted and the whole pass retried with backoff.
//!
//! Sources are never deleted here; gc removes retired files after its grace period, when no
//! in-flight reader can still be opening them (study §10 #461).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use serde::Serialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::engine::{Engine, EngineConfig, MergeStats};
use crate::error::{Error, Result};
use crate::job;
use crate::lake::manifest::{self, CommitPolicy, FileEntry, Manifest, Tier};
use crate::lake::owner;
use crate::lake::{KeyKind, footer};
use crate::report::label;
use crate::source::registry::Registered;
use crate::store::delete_or_leave;

/// Compact runs with the shared lake-job context.
pub use crate::job::Context;

/// The manifest field listing merged paths awaiting gc.
pub const RETIRED: &str = "retired";

/// A test seam called after the new base is staged, before the manifest save.
pub type Hook = Arc<dyn Fn(i16) -> BoxFuture<'static, ()> + Send + Sync>;

/// Compact options (defaults as in DESIGN §4.3).
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
    /// [`COMMIT_LEASE`]).
    pub commit_lease: Duration,
}

/// The longest a compaction may take from staging its new base to listing it. Until listed,
/// the base is an orphan to gc; gc's grace must be at least twice this (the CLI refuses a
/// shorter `--grace`), so a base older than this is never published: it may already be gone.
pub const COMMIT_LEASE: Duration = Duration::from_secs(5 * 60);

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
            commit_lease: COMMIT_LEASE,
        }
    }
}

/// What compact decides for a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Nothing to do.
    Noop,
    /// Relabel the deltas as base; no data rewritten.
    Promote,
    /// Merge every listed file into one new base.
    Rewrite,
}

/// The plan and the numbers behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The decision.
    pub decision: Decision,
    /// Why, in words.
    pub reason: String,
    /// Base files, rows and bytes.
    pub base_files: usize,
    /// Rows in the base tier.
    pub base_rows: i64,
    /// Bytes in the base tier.
    pub base_bytes: i64,
    /// Delta files.
    pub delta_files: usize,
    /// Rows in the delta tier.
    pub delta_rows: i64,
    /// Bytes in the delta tier.
    pub delta_bytes: i64,
    /// delta rows / base rows (0 without base rows).
    pub dirty_ratio: f64,
}

/// Decides what to do with a manifest (no I/O).
pub fn plan(m: &Manifest, opts: &CompactOptions) -> Plan {
    let sum = |tier: Tier| {
        m.tier(tier).fold((0usize, 0i64, 0i64), |(n, r, b), f| {
            (n + 1, r + f.row_count, b + f.size_bytes)
        })
    };
    let (base_files, base_rows, base_bytes) = sum(Tier::Base);
    let (delta_files, delta_rows, delta_bytes) = sum(Tier::Delta);
    let dirty_ratio = if base_rows > 0 {
        delta_rows as f64 / base_rows as f64
    } else {
        0.0
    };
    let target = i64::try_from(opts.target_base_size).unwrap_or(i64::MAX);
    let (decision, reason) = if delta_files == 0 {
        (Decision::Noop, "no deltas".to_string())
    } else if delta_bytes >= target {
        (
            Decision::Promote,
            format!("delta bytes {delta_bytes} >= --target-base-size {target}"),
        )
    } else if base_rows > 0 && dirty_ratio > opts.dirty_ratio {
        (
            Decision::Rewrite,
            format!(
                "delta rows / base rows {dirty_ratio:.4} > --dirty-ratio {}",
                opts.dirty_ratio
            ),
        )
    } else if base_rows == 0 {
        (
            Decision::Noop,
            format!("no base rows yet and delta bytes {delta_bytes} < --target-base-size {target}"),
        )
    } else {
        (
            Decision::Noop,
            format!(
                "delta rows / base rows {dirty_ratio:.4} <= --dirty-ratio {}",
                opts.dirty_ratio
            ),
        )
    };
    Plan {
        decision,
        reason,
        base_files,
        base_rows,
        base_bytes,
        delta_files,
        delta_rows,
        delta_bytes,
        dirty_ratio,
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
                out.push_str(&format!("    new base {b}\n"));
            }
            if let Some(e) = &s.error {
                out.push_str(&format!("    {e}\n"));
            }
        }
        if self.dry_run {
            out.push_str("dry run: nothing was written\n");
        }
        out
    }
}

/// Runs compaction over the selected schemas.
pub async fn run(
    ctx: &Context,
    opts: &CompactOptions,
    hook: Option<Hook>,
) -> Result<CompactReport> {
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
        match pass(ctx, opts, hook.clone(), reg.id, &mut out).await {
            Ok(()) => break,
            Err(PassError::Retry(why)) if out.attempts <= opts.max_retries => {
                tracing::info!(schema_id = reg.id, why, "compaction lost a race; retrying");
                let backoff = policy
                    .base_backoff
                    .saturating_mul(1 << out.attempts.min(8))
                    .min(Duration::from_secs(10));
                tokio::time::sleep(backoff).await;
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

async fn pass(
    ctx: &Context,
    opts: &CompactOptions,
    hook: Option<Hook>,
    schema_id: i16,
    out: &mut SchemaCompact,
) -> Result<(), PassError> {
    let store = ctx.lake.store.as_ref();
    let key = ctx.lake.layout.manifest_key(schema_id);
    let Some(loaded) = manifest::load(store, &key, schema_id).await? else {
        out.outcome = Outcome::NoManifest;
        return Ok(());
    };
    let plan = plan(&loaded.manifest, opts);
    out.plan = Some(plan.clone());
    if plan.decision == Decision::Noop {
        return Ok(());
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
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|source| Error::Io {
                    op: "create work dir",
                    path: dir.clone(),
                    source,
                })?;
            let res = rewrite(
                ctx,
                opts,
                hook,
                schema_id,
                &ownership,
                &loaded.manifest,
                &dir,
                out,
            )
            .await;
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

/// Refuses entries that do not name a lake file of this schema (study §10 #417).
fn check_source(ctx: &Context, schema_id: i16, f: &FileEntry) -> Result<()> {
    match ctx.lake.layout.classify(&f.path) {
        KeyKind::Delta { schema_id: s, .. }
        | KeyKind::InitBase { schema_id: s, .. }
        | KeyKind::MergedBase { schema_id: s, .. }
            if s == schema_id =>
        {
            Ok(())
        }
        _ => Err(Error::Manifest {
            key: ctx.lake.layout.manifest_key(schema_id),
            message: format!(
                "entry {:?} is not a lake file of schema {schema_id} under {}: refusing to compact it",
                f.path,
                ctx.lake.layout.schema_prefix(schema_id)
            ),
        }),
    }
}

async fn download(
    ctx: &Context,
    opts: &CompactOptions,
    f: &FileEntry,
    local: PathBuf,
) -> Result<PathBuf> {
    let dl = ctx
        .lake
        .store
        .get_to_file(&f.path, &local)
        .await
        .map_err(Error::storage("download compaction source", f.path.clone()))?;
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

#[allow(clippy::too_many_arguments)] // one call site; the arguments are the pass's context
async fn rewrite(
    ctx: &Context,
    opts: &CompactOptions,
    hook: Option<Hook>,
    schema_id: i16,
    ownership: &owner::Ownership,
    m: &Manifest,
    dir: &std::path::Path,
    out: &mut SchemaCompact,
) -> Result<(), PassError> {
    let store = ctx.lake.store.as_ref();
    let layout = &ctx.lake.layout;
    for f in &m.files {
        check_source(ctx, schema_id, f)?;
    }
    // 1. download + verify, then the system-column check.
    let t = Instant::now();
    let sources: Vec<PathBuf> =
        stream::iter(m.files.clone().into_iter().enumerate())
            .map(|(i, f)| async move {
                download(ctx, opts, &f, dir.join(format!("src-{i}.parquet"))).await
            })
            .buffered(opts.download_parallelism.max(1))
            .collect::<Vec<Result<PathBuf>>>()
            .await
            .into_iter()
            .collect::<Result<_>>()?;
    tracing::debug!(
        ms = t.elapsed().as_millis() as u64,
        files = m.files.len(),
        "compact step download"
    );
    // 2. merge.
    let t = Instant::now();
    let merged = dir.join("merged.parquet");
    let Merged {
        rows_in,
        stats,
        columns,
    } = {
        let (cfg, sources, merged) = (opts.engine.clone(), sources.clone(), merged.clone());
        tokio::task::spawn_blocking(move || -> Result<Merged> {
            let mut rows_in = 0u64;
            for s in &sources {
                rows_in += u64::try_from(footer::check_file(s)?.row_count).unwrap_or(0);
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
        .map_err(|e| Error::Invariant(format!("merge task failed: {e}")))??
    };
    tracing::debug!(ms = t.elapsed().as_millis() as u64, "compact step merge");
    out.files_in = m.files.len();
    out.rows_in = rows_in;
    // 3. stage and promote.
    let t = Instant::now();
    let tmp = layout.tmp_key(schema_id, Uuid::new_v4());
    let put = match store.put_file(&tmp, &merged).await {
        Ok(p) => p,
        Err(source) => {
            let _ = store.delete(&tmp).await;
            return Err(Error::Storage {
                op: "upload merged base",
                key: tmp,
                source,
            }
            .into());
        }
    };
    let base = layout.merged_base_key(schema_id, Uuid::now_v7());
    // The lease starts before the copy creates the base (gc ages objects by their creation).
    // It is measured on both clocks: the monotonic one does not count a suspended host (gc on
    // another host keeps counting), the wall clock can jump; the longer age counts.
    let staged = Instant::now();
    let staged_ms = ctx.clock.now_ms();
    if let Err(source) = store.copy(&tmp, &base).await {
        let _ = store.delete(&tmp).await;
        return Err(Error::Storage {
            op: "promote merged base",
            key: base,
            source,
        }
        .into());
    }
    delete_or_leave(store, &tmp, "temporary object").await;
    tracing::debug!(ms = t.elapsed().as_millis() as u64, "compact step upload");
    if let Some(h) = &hook {
        h(schema_id).await;
    }
    // 4. the splice.
    let merged_paths: BTreeSet<String> = m.files.iter().map(|f| f.path.clone()).collect();
    let entry = FileEntry {
        tier: Tier::Base,
        path: base.clone(),
        row_id_min: stats.row_id_min.clone().unwrap_or_default(),
        row_id_max: stats.row_id_max.clone().unwrap_or_default(),
        created_min: stats.changed_min,
        created_max: stats.changed_max,
        size_bytes: i64::try_from(put.size).unwrap_or(i64::MAX),
        row_count: i64::try_from(stats.rows_out).unwrap_or(i64::MAX),
        checksum: Some(put.checksum()),
        columns: Some(columns.into_iter().collect()),
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
        ownership,
        ctx.clock.as_ref(),
        policy,
        |m| {
            let wall = u64::try_from(ctx.clock.now_ms().saturating_sub(staged_ms)).unwrap_or(0);
            let (mono, wall) = (staged.elapsed(), Duration::from_millis(wall));
            if mono.max(wall) > opts.commit_lease {
                return Err(Error::Invariant(format!(
                    "the new base {base} was staged {}s ago ({}s by the wall clock), longer than \
                     the {}s lease (a slow store, a suspended host, a clock step?): gc may \
                     already treat it as an orphan, so it is not published; run compact again",
                    mono.as_secs(),
                    wall.as_secs(),
                    opts.commit_lease.as_secs()
                )));
            }
            let listed: BTreeSet<&String> = m.files.iter().map(|f| &f.path).collect();
            if let Some(gone) = merged_paths.iter().find(|p| !listed.contains(p)) {
                vanished = Some(gone.clone());
                return Err(Error::Invariant(format!("{gone} is no longer listed")));
            }
            m.files.retain(|f| !merged_paths.contains(&f.path));
            m.files.push(entry.clone());
            // Stamped at this attempt: gc's grace for the sources starts when they are unlisted.
            retire(m, &merged_paths, ctx.clock.now_ms());
            Ok(())
        },
    )
    .await;
    match committed {
        Ok(_) => {
            out.files_out = 1;
            out.rows_out = stats.rows_out;
            out.bytes_out = put.size;
            out.new_base = Some(base);
            Ok(())
        }
        Err(Error::AmbiguousCommit { key, source }) => Err(PassError::Fail(Error::Manifest {
            key,
            message: format!(
                "the save of the new base {base} may or may not have landed ({source}); the base is kept — run verify/inspect before compacting again"
            ),
        })),
        Err(e) => {
            // Provably not committed: the staged base is unlisted garbage now.
            delete_or_leave(store, &base, "staged base").await;
            match vanished {
                Some(path) => Err(PassError::Retry(format!(
                    "{path} left the manifest meanwhile"
                ))),
                None => Err(PassError::Fail(e)),
            }
        }
    }
}

/// Records merged or replaced paths under the manifest's `retired` list (deleted by gc after
/// its grace period).
pub fn retire(m: &mut Manifest, paths: &BTreeSet<String>, now: i64) {
    let list = m
        .extra
        .entry(RETIRED.to_string())
        .or_insert_with(|| Value::Array(Vec::new()));
    if !list.is_array() {
        *list = Value::Array(Vec::new());
    }
    if let Value::Array(items) = list {
        let known: BTreeSet<String> = items
            .iter()
            .filter_map(|v| v.get("path").and_then(Value::as_str).map(str::to_string))
            .collect();
        for p in paths.iter().filter(|p| !known.contains(*p)) {
            items.push(json!({"path": p, "retired_at_ms": now}));
        }
    }
}

/// Drops `paths` from the manifest's `retired` list (gc, once their objects are gone).
pub fn forget_retired(m: &mut Manifest, paths: &BTreeSet<String>) {
    if let Some(Value::Array(items)) = m.extra.get_mut(RETIRED) {
        items.retain(|v| {
            v.get("path")
                .and_then(Value::as_str)
                .is_none_or(|p| !paths.contains(p))
        });
    }
}

/// The paths a manifest lists as retired.
pub fn retired_paths(m: &Manifest) -> BTreeSet<String> {
    retired_since(m).into_keys().collect()
}

/// When each path in the manifest's `retired` list was retired (epoch ms; 0 when unknown).
pub fn retired_since(m: &Manifest) -> std::collections::BTreeMap<String, i64> {
    m.extra
        .get(RETIRED)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|v| {
                    let path = v.get("path").and_then(Value::as_str)?;
                    let at = v.get("retired_at_ms").and_then(Value::as_i64).unwrap_or(0);
                    Some((path.to_string(), at))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn retire_records_each_path_once() {
        let mut m = Manifest::empty(7);
        let paths: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        retire(&mut m, &paths, 5);
        retire(&mut m, &paths, 6);
        assert_eq!(retired_paths(&m), paths);
        assert_eq!(m.extra[RETIRED].as_array().unwrap().len(), 2);
    }
}
