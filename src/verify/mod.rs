//! `lakecdc verify`: proves the lake intact. Under each schema's lock it re-downloads every
//! listed object (bounded parallelism, hashing while downloading) and checks its size, its
//! SHA-256, the Parquet footer's system columns and row count, and the column stamp against the
//! manifest. An entry whose object is missing is reported dangling only after a second look (the
//! manifest is re-read and the object probed again), so a concurrent compaction never produces
//! a false alarm. A listed path that is not a data file of the schema is reported `foreign` and
//! never requested (docs/hazards.md S1); an object larger than its entry says is reported
//! `size` and not downloaded (S2). Nothing is written.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use futures::{StreamExt, stream};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::job;
use crate::lake::footer;
use crate::lake::manifest::{self, FileEntry};
use crate::source::registry::{Kind, Registered};
use crate::store::StoreError;

mod runs;
mod source;
pub use source::{Class, SourceCheck, SourceOptions};

/// Verify runs with the shared lake-job context.
pub use crate::job::Context;

/// Verify options.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Schema names or ids; empty = every registered schema.
    pub schemas: Vec<String>,
    /// Objects downloaded at once.
    pub parallelism: usize,
    /// Where downloads are staged (removed right after checking).
    pub work_dir: PathBuf,
    /// Compare the lake with its source database instead of re-hashing it (`--source`).
    pub source: Option<SourceOptions>,
    /// DuckDB, for `--source --deep` (which exports the source's rows as init would).
    pub engine: crate::engine::EngineConfig,
}

/// One problem found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The object key.
    pub path: String,
    /// `foreign`, `dangling`, `size`, `checksum`, `footer`, `row_count`, `columns` or
    /// `unstamped`.
    pub kind: &'static str,
    /// What was expected and found.
    pub detail: String,
}

/// Outcome for one schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every listed object matches the manifest.
    Intact,
    /// At least one object diverges or is missing.
    Diverged,
    /// The schema has no manifest yet.
    NoManifest,
    /// Another process holds the schema lock; verify it later.
    Locked,
    /// Verification could not complete.
    Failed,
    /// A stop request (SIGTERM/SIGINT) came before this schema was verified; verify it later.
    Stopped,
}

/// Report for one schema.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SchemaVerify {
    /// Schema id.
    pub schema_id: i16,
    /// Schema name.
    pub schema: String,
    /// Outcome.
    pub outcome: Outcome,
    /// Listed objects checked.
    pub files: usize,
    /// Bytes re-hashed.
    pub bytes: u64,
    /// Problems, divergences first.
    pub problems: Vec<Problem>,
    /// The failure, for `failed`.
    pub error: Option<String>,
    /// The comparison with the source (`--source`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceCheck>,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

impl SchemaVerify {
    /// A schema's report before anything was checked.
    fn new(reg: &Registered) -> Self {
        Self {
            schema_id: reg.id,
            schema: reg.name.clone(),
            outcome: Outcome::Intact,
            files: 0,
            bytes: 0,
            problems: Vec::new(),
            error: None,
            source: None,
            duration_ms: 0,
        }
    }
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifyReport {
    /// Per schema, by id.
    pub schemas: Vec<SchemaVerify>,
}

impl VerifyReport {
    /// 0 intact, 1 when a schema could not be verified, 3 when something diverged or a schema
    /// was locked or skipped by a stop request.
    pub fn exit_code(&self) -> i32 {
        if self.schemas.iter().any(|s| s.outcome == Outcome::Failed) {
            1
        } else if self.schemas.iter().any(|s| {
            matches!(
                s.outcome,
                Outcome::Diverged | Outcome::Locked | Outcome::Stopped
            )
        }) {
            3
        } else {
            0
        }
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "{:<24} {:>6} {:<12} {:>7} {:>14}\n",
            "SCHEMA", "ID", "OUTCOME", "FILES", "BYTES"
        );
        for s in &self.schemas {
            let outcome = match s.outcome {
                Outcome::Intact => "intact",
                Outcome::Diverged => "DIVERGED",
                Outcome::NoManifest => "no_manifest",
                Outcome::Locked => "locked",
                Outcome::Failed => "FAILED",
                Outcome::Stopped => "stopped",
            };
            out.push_str(&format!(
                "{:<24} {:>6} {:<12} {:>7} {:>14}\n",
                s.schema, s.schema_id, outcome, s.files, s.bytes
            ));
            for p in &s.problems {
                out.push_str(&format!(
                    "    {} {}: {}\n",
                    p.kind,
                    crate::report::printable(&p.path, false),
                    crate::report::printable(&p.detail, false)
                ));
            }
            if let Some(c) = &s.source {
                out.push_str(&c.to_text());
            }
            if let Some(e) = &s.error {
                out.push_str(&format!("    {}\n", crate::report::printable(e, false)));
            }
        }
        out
    }
}

/// Verifies the selected schemas.
pub async fn run(ctx: &Context, opts: &VerifyOptions) -> Result<VerifyReport> {
    let (scratch, engine) = job::scratch(&opts.work_dir, &opts.engine)?;
    let opts = &VerifyOptions {
        work_dir: scratch.path().to_path_buf(),
        engine,
        ..opts.clone()
    };
    // Pre-flight: --deep needs every selected schema's metadata before anything runs.
    // The source's identity is read meanwhile (--source).
    let guard = opts.source.is_some().then(|| {
        let ctx = ctx.clone();
        tokio::spawn(async move { job::source_guard(&ctx).await })
    });
    let targets = job::select_schemas(ctx, &opts.schemas).await?;
    let mut defs = BTreeMap::new();
    if opts.source.as_ref().is_some_and(|s| s.deep) {
        let dir = ctx.schema_dir.as_deref().ok_or_else(|| {
            Error::setting(
                "schema-dir",
                "is needed by verify --source --deep (the attribute metadata)",
            )
        })?;
        for reg in targets.iter().filter(|r| r.kind == Kind::Schema) {
            defs.insert(reg.id, crate::schema::dir::load(dir, &reg.name)?);
        }
    }
    let defs = &defs;
    // The database this run reads, to note a lake written from another one.
    let guard = match guard {
        Some(g) => Some(
            g.await
                .map_err(Error::task("read the source's identity"))??,
        ),
        None => None,
    };
    let guard = guard.as_ref();
    let schemas = job::each_until_stopped(
        &ctx.shutdown,
        targets,
        |r| &r.name,
        |reg| async move {
            match &opts.source {
                Some(so) => verify_source(ctx, opts, so, guard, &reg, defs.get(&reg.id)).await,
                None => verify_schema(ctx, opts, &reg).await,
            }
        },
        |reg| SchemaVerify {
            outcome: Outcome::Stopped,
            ..SchemaVerify::new(&reg)
        },
    )
    .await;
    let report = VerifyReport { schemas };
    tracing::info!(
        schemas = report.schemas.len(),
        problems = report
            .schemas
            .iter()
            .map(|s| s.problems.len())
            .sum::<usize>(),
        divergent_rows = report
            .schemas
            .iter()
            .filter_map(|s| s.source.as_ref().map(|c| c.divergent()))
            .sum::<u64>(),
        exit_code = report.exit_code(),
        "verify done"
    );
    Ok(report)
}

/// `--source`: the schema's lake against its database, under the schema lock.
async fn verify_source(
    ctx: &Context,
    opts: &VerifyOptions,
    so: &SourceOptions,
    guard: Option<&crate::lake::SourceGuard>,
    reg: &Registered,
    def: Option<&crate::schema::SchemaDef>,
) -> SchemaVerify {
    let started = Instant::now();
    let mut out = SchemaVerify::new(reg);
    let result = job::with_lock(ctx, reg.id, async |lock| {
        // No manifest is a lake holding no row: the source's flushed rows are then missing
        // from it, not proven (docs/hazards.md L95); with none, the outcome is `no_manifest`.
        let (files, lake_source, no_manifest) = match job::listed(ctx, reg.id).await? {
            Some((files, lake_source)) => (files, lake_source, false),
            None => (Vec::new(), None, true),
        };
        out.files = files.len();
        // A listed file that is gone or of another size cannot be read to prove its rows: the
        // schema diverges, naming it, and the comparison waits for the file or an init.
        out.problems = unreadable_listed(ctx, opts, reg.id, &files).await?;
        if !out.problems.is_empty() {
            out.outcome = Outcome::Diverged;
            return Ok(());
        }
        let (mut check, divergent) = source::check(
            ctx,
            so,
            &opts.engine,
            &opts.work_dir,
            reg.id,
            match reg.kind {
                Kind::Table => source::What::Table,
                Kind::Schema => source::What::Schema(def),
            },
            files,
        )
        .await?;
        if let (Some(listed), Some(guard)) = (lake_source, guard) {
            let key = ctx.lake.layout.manifest_key(reg.id);
            if let Err(e) = guard.check(&key, Some(&listed)) {
                check.other_source = Some(e.to_string());
            }
        }
        if check.divergent() > 0 {
            out.outcome = Outcome::Diverged;
        } else if no_manifest {
            out.outcome = Outcome::NoManifest;
        }
        // The comparison stays in the report even when the repair cannot be made.
        let check = out.source.insert(check);
        if so.repair {
            source::repair(ctx, lock, &divergent, check).await?;
        }
        Ok(())
    })
    .await;
    finished(out, result, started)
}

/// Of `missing` (listed objects a first look did not find), those still listed by the manifest
/// and still absent: a second look, so a compaction retiring a file meanwhile is no alarm.
async fn dangling(ctx: &Context, schema_id: i16, missing: Vec<String>) -> Result<Vec<String>> {
    if missing.is_empty() {
        return Ok(missing);
    }
    let (store, layout) = (ctx.lake.store.as_ref(), &ctx.lake.layout);
    let key = layout.manifest_key(schema_id);
    let relisted: Vec<String> = manifest::load_within(store, &key, schema_id, ctx.lake.limits())
        .await?
        .map(|l| l.manifest.files.into_iter().map(|f| f.path).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for path in missing.into_iter().filter(|p| relisted.contains(p)) {
        match store.head(&path).await {
            Err(StoreError::NotFound) => out.push(path),
            Ok(_) => {}
            Err(source) => {
                return Err(Error::Storage {
                    op: "probe listed object",
                    key: path,
                    source,
                });
            }
        }
    }
    Ok(out)
}

/// The listed files of `files` that are missing from the store (`dangling`, after a second
/// look at the manifest, as plain verify makes it) or whose size is not the listed one
/// (`size`): one HEAD each, `--parallelism` at once (docs/hazards.md L94).
async fn unreadable_listed(
    ctx: &Context,
    opts: &VerifyOptions,
    schema_id: i16,
    files: &[FileEntry],
) -> Result<Vec<Problem>> {
    let store = ctx.lake.store.as_ref();
    let fix = "restore the object, or rebuild the schema with lakecdc init --replace-delta";
    let listed: Vec<(String, i64)> = files
        .iter()
        .map(|f| (f.path.clone(), f.size_bytes))
        .collect();
    let heads: Vec<(String, i64, std::result::Result<u64, StoreError>)> = stream::iter(listed)
        .map(|(path, size)| async move {
            let head = store.head(&path).await.map(|m| m.size);
            (path, size, head)
        })
        .buffer_unordered(opts.parallelism.max(1))
        .collect()
        .await;
    let mut problems = Vec::new();
    let mut missing = Vec::new();
    for (path, listed, head) in heads {
        match head {
            Ok(size) if i64::try_from(size).ok() == Some(listed) => {}
            Ok(size) => problems.push(Problem {
                path,
                kind: "size",
                detail: format!("manifest {listed} bytes, object {size}: {fix}"),
            }),
            Err(StoreError::NotFound) => missing.push(path),
            Err(source) => {
                return Err(Error::Storage {
                    op: "probe listed object",
                    key: path,
                    source,
                });
            }
        }
    }
    for path in dangling(ctx, schema_id, missing).await? {
        problems.push(Problem {
            path,
            kind: "dangling",
            detail: format!("listed in the manifest but the object does not exist: {fix}"),
        });
    }
    problems.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(problems)
}

/// A schema's report once its locked step returned `result` (`None`: the lock was held).
fn finished(mut out: SchemaVerify, result: Result<Option<()>>, started: Instant) -> SchemaVerify {
    match result {
        Ok(Some(())) => {}
        Ok(None) => out.outcome = Outcome::Locked,
        Err(e) => {
            out.outcome = Outcome::Failed;
            out.error = Some(job::failed("verify", &out.schema, e.chain()));
        }
    }
    out.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    out
}

async fn verify_schema(ctx: &Context, opts: &VerifyOptions, reg: &Registered) -> SchemaVerify {
    let started = Instant::now();
    let mut out = SchemaVerify::new(reg);
    let result = job::with_lock(ctx, reg.id, async |_| {
        check_schema(ctx, opts, reg.id, &mut out).await
    })
    .await;
    finished(out, result, started)
}

async fn check_schema(
    ctx: &Context,
    opts: &VerifyOptions,
    schema_id: i16,
    out: &mut SchemaVerify,
) -> Result<()> {
    let store = ctx.lake.store.as_ref();
    let (layout, limits) = (&ctx.lake.layout, ctx.lake.limits());
    let key = layout.manifest_key(schema_id);
    let Some(loaded) = manifest::load_within(store, &key, schema_id, limits).await? else {
        out.outcome = Outcome::NoManifest;
        return Ok(());
    };
    let entries = loaded.manifest.files;
    out.files = entries.len();
    // A path that is not a data file of this schema is named, never requested.
    let (ours, foreign): (Vec<FileEntry>, Vec<FileEntry>) = entries
        .into_iter()
        .partition(|e| layout.check_listed(schema_id, &e.path).is_ok());
    for e in foreign {
        out.problems.push(Problem {
            detail: format!(
                "not a data file of schema {schema_id} under {}: not read",
                layout.schema_prefix(schema_id)
            ),
            path: e.path,
            kind: "foreign",
        });
    }
    let checks: Vec<Result<Check>> = stream::iter(ours)
        .map(|e| async move { check_entry(ctx, opts, &e).await })
        .buffer_unordered(opts.parallelism.max(1))
        .collect()
        .await;
    let mut missing = Vec::new();
    for c in checks {
        match c? {
            Check::Present { bytes, problems } => {
                out.bytes = out.bytes.saturating_add(bytes);
                out.problems.extend(problems);
            }
            Check::Missing(path) => missing.push(path),
        }
    }
    for path in dangling(ctx, schema_id, missing).await? {
        out.problems.push(Problem {
            path,
            kind: "dangling",
            detail: "listed in the manifest but the object does not exist".into(),
        });
    }
    out.problems
        .sort_by_key(|p| (p.kind == "unstamped", p.path.clone()));
    if out.problems.iter().any(|p| p.kind != "unstamped") {
        out.outcome = Outcome::Diverged;
    }
    Ok(())
}

enum Check {
    Present { bytes: u64, problems: Vec<Problem> },
    Missing(String),
}

/// Checks one listed object (a data file of the schema: [`crate::lake::Layout::check_listed`]).
/// Its download stops at the size its entry lists: an object larger than that is a `size`
/// problem, so a listed object never costs more disk than the manifest declares.
async fn check_entry(ctx: &Context, opts: &VerifyOptions, e: &FileEntry) -> Result<Check> {
    let storage = |source| Error::Storage {
        op: "download listed object",
        key: e.path.clone(),
        source,
    };
    let listed = u64::try_from(e.size_bytes).unwrap_or(0);
    // An entry without a size (older writers) is bounded by what the store says it holds.
    let limit = match listed {
        0 => match ctx.lake.store.head(&e.path).await {
            Ok(meta) => meta.size,
            Err(StoreError::NotFound) => return Ok(Check::Missing(e.path.clone())),
            Err(source) => return Err(storage(source)),
        },
        n => n,
    };
    // The entry's size is the lake writer's to choose: the work dir must hold it, once per
    // download running at a time, before any byte arrives (docs/hazards.md S2).
    let free = job::available_bytes(&opts.work_dir).map_err(|source| Error::Io {
        op: "measure free space of work dir",
        path: opts.work_dir.clone(),
        source,
    })?;
    job::check_work_dir_space(
        &opts.work_dir,
        "verify (the listed objects it downloads at once)",
        limit.saturating_mul(opts.parallelism as u64),
        free,
    )?;
    let local = opts
        .work_dir
        .join(format!("lakecdc-verify-{}.parquet", uuid::Uuid::new_v4()));
    let got = ctx
        .lake
        .store
        .get_to_file_within(&e.path, &local, limit)
        .await;
    if let Err(StoreError::TooLarge { size, .. }) = &got {
        let _ = tokio::fs::remove_file(&local).await;
        return Ok(Check::Present {
            bytes: 0,
            problems: vec![Problem {
                path: e.path.clone(),
                kind: "size",
                detail: format!(
                    "manifest {} bytes, object at least {size}: larger than listed, not read further",
                    e.size_bytes
                ),
            }],
        });
    }
    let result = match got {
        Err(StoreError::NotFound) => Ok(Check::Missing(e.path.clone())),
        Err(source) => Err(storage(source)),
        Ok(dl) => {
            let e = e.clone();
            let path = local.clone();
            tokio::task::spawn_blocking(move || {
                let mut problems = Vec::new();
                let mut problem = |kind, detail: String| {
                    problems.push(Problem {
                        path: e.path.clone(),
                        kind,
                        detail,
                    })
                };
                if i64::try_from(dl.size).ok() != Some(e.size_bytes) {
                    problem(
                        "size",
                        format!("manifest {} bytes, object {}", e.size_bytes, dl.size),
                    );
                }
                let actual = format!("sha256:{}", hex::encode(dl.sha256));
                match &e.checksum {
                    None => problem("unstamped", "the entry has no checksum to compare".into()),
                    Some(want) if *want != actual => {
                        problem("checksum", format!("manifest {want}, object {actual}"));
                    }
                    Some(_) => {}
                }
                match footer::check_file(&path) {
                    Err(err) => problem("footer", err.to_string()),
                    Ok(info) => {
                        if info.row_count != e.row_count {
                            problem(
                                "row_count",
                                format!("manifest {} rows, footer {}", e.row_count, info.row_count),
                            );
                        }
                        let found: BTreeMap<String, String> = info.columns.into_iter().collect();
                        if let Some(stamp) = &e.columns
                            && *stamp != found
                        {
                            problem("columns", format!("manifest {stamp:?}, footer {found:?}"));
                        }
                        // Point lookups prune by the listed range: it must be the file's own
                        // (a range that parses; one that does not prunes nothing).
                        if let (Ok(lo), Ok(hi)) = (
                            uuid::Uuid::parse_str(&e.row_id_min),
                            uuid::Uuid::parse_str(&e.row_id_max),
                        ) {
                            match footer::row_id_range(&path) {
                                Err(err) => problem("row_id_range", err.to_string()),
                                Ok(Some(actual)) if actual != (lo, hi) => problem(
                                    "row_id_range",
                                    format!("manifest {lo}..{hi}, file {}..{}", actual.0, actual.1),
                                ),
                                Ok(_) => {}
                            }
                        }
                    }
                }
                Check::Present {
                    bytes: dl.size,
                    problems,
                }
            })
            .await
            .map_err(Error::task("verify"))
        }
    };
    let _ = tokio::fs::remove_file(&local).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lake writer's path or message cannot add a line to the text report (docs/hazards.md
    /// S10): a forged "intact" row stays inside the problem's own line, escaped.
    #[test]
    fn lake_strings_cannot_forge_report_lines() {
        let forged =
            "data/100/x.parquet\ncustomer                    100 intact          1              1";
        let report = VerifyReport {
            schemas: vec![SchemaVerify {
                schema_id: 100,
                schema: "customer".into(),
                outcome: Outcome::Diverged,
                files: 1,
                bytes: 1,
                problems: vec![Problem {
                    path: forged.into(),
                    kind: "foreign",
                    detail: "not read\u{1b}[2K".into(),
                }],
                error: Some("boom\nsecond line".into()),
                source: None,
                duration_ms: 0,
            }],
        };
        let text = report.to_text();
        assert_eq!(
            text.lines().filter(|l| l.contains("intact")).count(),
            1,
            "{text}"
        );
        assert!(text.contains("x.parquet\\ncustomer"), "{text}");
        assert!(
            text.contains("\\u{1b}[2K") && !text.contains('\u{1b}'),
            "{text}"
        );
        assert!(text.contains("boom\\nsecond line"), "{text}");
    }
}
