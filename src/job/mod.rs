//! What the jobs share, below them so that no job imports another: their context, the schema
//! selection from the registry, running a step under a schema's advisory lock, uploading a new
//! object to its final key and the commit lease that
//! compact observes and gc's grace is measured against.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::Tables;
use crate::engine::EngineConfig;
use crate::error::{Error, Result};
use crate::lake::{Lake, SourceGuard, SourceIdentity};
use crate::scratch::Scratch;
use crate::shutdown::Shutdown;
use crate::source::registry::{self, Registered};
use crate::source::{Connector, SchemaLock};

pub mod catalog;
mod staging;

pub use staging::{Staged, upload, upload_parts};

/// The longest a compaction may take from staging its new base to listing it. Until listed,
/// the base is an orphan to gc; gc's grace must be at least twice this (a shorter grace is
/// refused), so a base older than this is never published: it may already be gone.
pub const COMMIT_LEASE: Duration = Duration::from_secs(5 * 60);

/// Everything a job needs besides its options.
#[derive(Debug, Clone)]
pub struct Context {
    /// PostgreSQL (registry, locks and, for flush and init, the source rows).
    pub connector: Connector,
    /// Source table names.
    pub tables: Tables,
    /// The schema directory (needed by flush and init when something is to be exported).
    pub schema_dir: Option<PathBuf>,
    /// The lake.
    pub lake: Lake,
    /// Time, so tests can move it.
    pub clock: Arc<dyn Clock>,
    /// Stop request.
    pub shutdown: Shutdown,
    /// Take over a lake whose manifests name another source database (`--adopt-source`,
    /// docs/design.md §10).
    pub adopt_source: bool,
    /// How long a job waits for a schema lock another session holds before it reports the
    /// schema `locked` (`--lock-wait`; zero: not at all).
    pub lock_wait: Duration,
}

/// The guard a writer checks and stamps manifests with: the database `ctx` reads, and whether
/// it may adopt a lake written from another (docs/design.md §10).
pub async fn source_guard(ctx: &Context) -> Result<SourceGuard> {
    source_guard_on(ctx, &ctx.connector.connect().await?).await
}

/// [`source_guard`] on a connection the job already has.
pub async fn source_guard_on(ctx: &Context, client: &crate::source::Client) -> Result<SourceGuard> {
    guard_of(client, ctx.adopt_source).await
}

/// The guard of the database `client` reads, adopting another source's lake when `adopt`.
pub async fn guard_of(client: &crate::source::Client, adopt: bool) -> Result<SourceGuard> {
    let (system_identifier, database) = crate::source::identify(client).await?;
    Ok(SourceGuard {
        identity: SourceIdentity::new(system_identifier, database),
        adopt,
    })
}

/// Loads the manifest's listed files of `schema_id`, or `None` without a manifest; a path that
/// is not a data file of the schema is refused (docs/hazards.md S1).
pub async fn listed(
    ctx: &Context,
    schema_id: i16,
) -> Result<
    Option<(
        Vec<crate::lake::manifest::FileEntry>,
        Option<SourceIdentity>,
    )>,
> {
    let layout = &ctx.lake.layout;
    let key = layout.manifest_key(schema_id);
    let Some(l) = crate::lake::manifest::load_within(
        ctx.lake.store.as_ref(),
        &key,
        schema_id,
        layout.limits(),
    )
    .await?
    else {
        return Ok(None);
    };
    if let Some(foreign) = l.manifest.foreign_path(layout) {
        return Err(foreign.refusal(&key, "remove the entry"));
    }
    Ok(Some((l.manifest.files, l.manifest.source)))
}

/// The registered schemas and table sources named by `selectors` (all when empty), by id.
pub async fn select_schemas(ctx: &Context, selectors: &[String]) -> Result<Vec<Registered>> {
    let client = ctx.connector.connect().await?;
    let registered = registry::list_all(&client, &ctx.tables).await?;
    registry::select(&registered, selectors)
}

/// Runs `work` while holding the schema's lock (which `work` may check is still held before
/// it publishes); `Ok(None)` when another session still holds it after `ctx.lock_wait`. The
/// lock is released on the connection that took it, whatever `work` returned.
pub async fn with_lock<T>(
    ctx: &Context,
    schema_id: i16,
    work: impl AsyncFnOnce(&SchemaLock) -> Result<T>,
) -> Result<Option<T>> {
    with_lock_or_plan(ctx, schema_id, false, work).await
}

/// [`with_lock`], or for a dry run (`plan`) the same check that the schema is free, after
/// which the lock is given back at once: a plan never keeps a real run out (it would report
/// the schema `locked` for as long as the plan takes).
pub async fn with_lock_or_plan<T>(
    ctx: &Context,
    schema_id: i16,
    plan: bool,
    work: impl AsyncFnOnce(&SchemaLock) -> Result<T>,
) -> Result<Option<T>> {
    let lock = SchemaLock::acquire(&ctx.connector, schema_id, ctx.lock_wait, &ctx.shutdown);
    let Some(lock) = lock.await? else {
        return Ok(None);
    };
    let lock = if plan { lock.let_go().await? } else { lock };
    let out = work(&lock).await;
    if let Err(e) = lock.release().await {
        tracing::warn!(schema_id, error = %e.chain(), "schema lock release failed; closing its connection releases it");
    }
    out.map(Some)
}

/// Logs that `job` failed for `schema` — the error line a quiet (`-q`) run still prints on
/// stderr — and returns `reason` for the schema's report.
pub(crate) fn failed(job: &str, schema: &str, reason: String) -> String {
    tracing::error!(schema, error = %reason, "{job} failed");
    reason
}

/// Runs `work` for each selected schema, in id order; after a stop request the remaining
/// schemas are reported by `stopped` ([`each_until_stopped`]).
pub async fn each_schema<T, F: std::future::Future<Output = T>>(
    ctx: &Context,
    selectors: &[String],
    work: impl FnMut(Registered) -> F,
    stopped: impl FnMut(Registered) -> T,
) -> Result<Vec<T>> {
    let targets = select_schemas(ctx, selectors).await?;
    Ok(each_until_stopped(&ctx.shutdown, targets, |r| &r.name, work, stopped).await)
}

/// Runs `work` for each item, in order. After a stop request the remaining items are not
/// worked on but reported by `stopped`, so a stopped run never looks complete.
pub async fn each_until_stopped<I, T, F: std::future::Future<Output = T>>(
    shutdown: &Shutdown,
    items: impl IntoIterator<Item = I>,
    name: impl Fn(&I) -> &str,
    mut work: impl FnMut(I) -> F,
    mut stopped: impl FnMut(I) -> T,
) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if shutdown.is_requested() {
            tracing::warn!(schema = %name(&item), "stop requested: schema skipped");
            out.push(stopped(item));
        } else {
            out.push(work(item).await);
        }
    }
    out
}

/// Refuses `dir` (the value of `setting`) when a directory on its path is another user's, or
/// one others may write without the sticky bit ([`crate::scratch::untrusted_ancestor`]): one
/// line naming it and the fix. With `shared_ok` a shared one only warns: a work dir is often a
/// container's 0777 volume (Kubernetes `emptyDir`) that no other user can reach. A path that
/// cannot be judged (missing, unreadable) is left to the caller's own open, which names it.
pub(crate) fn refuse_untrusted(setting: &'static str, dir: &Path, shared_ok: bool) -> Result<()> {
    use crate::scratch::Untrusted;
    let (at, how) = match crate::scratch::untrusted_ancestor(dir) {
        Ok(Some(Untrusted::Foreign(at))) => (at, "owned by another user"),
        Ok(Some(Untrusted::Shared(at))) if shared_ok => {
            tracing::warn!(
                dir = %dir.display(),
                shared = %at.display(),
                "{setting} lies in a directory others may write without the sticky bit: another user of this host could swap lakecdc's private directory for theirs (chmod +t it, or choose a directory only you and root control)"
            );
            return Ok(());
        }
        Ok(Some(Untrusted::Shared(at))) => (at, "writable by others without the sticky bit"),
        Ok(None) | Err(_) => return Ok(()),
    };
    Err(Error::setting(
        setting,
        format!(
            "{} lies in {}, {how}, so lakecdc's private files there could be swapped for theirs: choose a directory that only you and root control",
            dir.display(),
            at.display()
        ),
    ))
}

/// The run's private scratch directory under `work_dir` (docs/security.md, "Local files"), and
/// `engine` set to spill inside it. Every local file of the run goes in the directory, which is
/// removed when the returned [`Scratch`] drops; the directories killed runs left in `work_dir`
/// are removed first (docs/hazards.md L64).
pub(crate) fn scratch(work_dir: &Path, engine: &EngineConfig) -> Result<(Scratch, EngineConfig)> {
    refuse_untrusted("work-dir", work_dir, true)?;
    let scratch = Scratch::create(work_dir).map_err(|source| Error::Io {
        op: "create a private scratch directory in",
        path: work_dir.to_path_buf(),
        source,
    })?;
    // Ours is locked now: what the sweep removes is only what killed runs left behind.
    match crate::scratch::sweep_leftovers(work_dir) {
        Ok(swept) if swept.dirs > 0 => tracing::warn!(
            work_dir = %work_dir.display(),
            dirs = swept.dirs,
            bytes = swept.bytes,
            "removed the scratch directories of runs killed before their cleanup"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(
            work_dir = %work_dir.display(),
            error = %e,
            "could not look for scratch directories left by killed runs"
        ),
    }
    let engine = EngineConfig {
        temp_directory: Some(scratch.spill_dir()),
        ..engine.clone()
    };
    Ok((scratch, engine))
}

/// The bytes an unprivileged user may still write on the file system holding `dir`.
pub fn available_bytes(dir: &Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(dir)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// Measures the free bytes of the file system holding a directory (for an unprivileged user).
pub type FreeSpace = fn(&Path) -> std::io::Result<u64>;

/// Refuses a step that needs `needed` bytes in `dir` when the file system has only `free`
/// left: running out halfway would fail the step anyway, and take the host's disk with it
/// (docs/hazards.md S2).
pub fn check_work_dir_space(dir: &Path, step: &'static str, needed: u64, free: u64) -> Result<()> {
    if needed > free {
        return Err(Error::NoSpace {
            path: dir.to_path_buf(),
            step,
            needed,
            free,
        });
    }
    Ok(())
}

/// Whether a heap-order read (init's, or a flush heap pass) whose spill and files need
/// `needed` bytes of `dir`'s `free` ones goes ahead: `auto` falls back to reading by row id
/// (no scratch disk: slower with random ids, never out of space); an explicit
/// `--read-order heap` is refused, naming `step`.
pub fn spill_fits(
    order: crate::source::heap_read::ReadOrder,
    dir: &Path,
    step: &'static str,
    needed: u64,
    free: u64,
) -> Result<bool> {
    if order == crate::source::heap_read::ReadOrder::Heap {
        check_work_dir_space(dir, step, needed, free)?;
    }
    Ok(needed <= free)
}
