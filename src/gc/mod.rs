//! `lakecdc gc`: removes proven garbage from a schema's data prefix (docs/design.md §4.4).
//!
//! Per schema, under its lock, gc first makes a plan (reads only): (1) the prefix's owner
//! marker must be this manifest's; (2) the prefix is listed and every unlisted key is classified
//! with the shared key parser; a prefix holding base-shaped objects while no manifest entry lies
//! in it is refused (docs/hazards.md #463): a mis-pointed manifest would make every base look
//! orphaned; (3) first sightings are read from `<manifest key>.gc-state` (forma's format:
//! `{"first_unlisted_ms": {key: ms}}`) and each deletable orphan — staging (`_tmp/`),
//! merged-base and init-base orphans, and files the manifest records as `retired` — is due only
//! when its first sighting, its retirement and the object itself are all older than the grace
//! period: an in-flight writer's staged or promoted-but-not-yet-committed file is always
//! younger. A second manifest load drops keys a writer listed meanwhile. Other unlisted deltas
//! (a flush whose manifest commit failed) are reported, never deleted; unknown keys are never
//! touched. `--dry-run` prints this plan. A manifest that lists or retires a path that is not a
//! data file of the schema is refused before anything is listed or deleted, and sightings of
//! keys outside the schema's shapes are dropped as they are read: gc only ever deletes keys it
//! listed under the schema's prefix and classified as its own (docs/hazards.md S1). The
//! sightings are read within [`crate::lake::ReadLimits::gc_state_bytes`] (S2).
//!
//! The real run then executes it: (4) delete the due orphans (a failed delete is kept for the
//! next run), (5) save the sightings with a conditional write, (6) drop the retired paths whose
//! objects are gone from the manifest (a conditional commit), (7) delete the manifest history
//! copies past the retention, (8) undo the writes killed runs left unfinished more than an
//! hour ago (S3 multipart uploads, a local lake's temporary files). A crash between steps
//! leaves deleted objects that nothing lists and sightings that are at most one run old: the
//! next run repeats what is left.
//!
//! Manifest history (time travel, docs/design.md §3.5): a retired file is kept while its
//! retirement is younger than the larger of the grace and the history retention
//! ([`crate::lake::Layout::history_retention`]), and gc deletes the history copies older than
//! the one in force at the start of the retention window, never the newest
//! ([`crate::lake::history`]). That keeps every file a kept copy lists: a file leaves the
//! listing only through a save that retires it (compaction, init; gc drops a retirement only
//! once the file is gone), so a copy that lists a file was saved before the file's retirement;
//! the copy in force at the window's start was superseded, if at all, by a save inside the
//! window, so every retirement of a file it lists is younger than the retention. With a
//! retention of zero history is off: retired files wait for the grace alone and every copy is
//! deleted. Only keys of the strict copy shape (`<20 digits>.json`) under the history prefix
//! are ever deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::job;
use crate::lake::manifest::FileEntry;
use crate::lake::{Capped, KeyKind, Layout, SourceGuard, read_capped};
use crate::lake::{history, manifest, owner};
use crate::report::label;
use crate::source::lock::SchemaLock;
use crate::source::registry::Registered;
use crate::store::PutMode;

mod settle;

pub use settle::LostDelta;

/// A test seam inside the settling of unlisted deltas, called with the schema id between
/// asking which of their rows are pending and which the source holds live; only
/// [`run_with_hook`] (the `testing` feature) takes one.
pub type SettleHook =
    std::sync::Arc<dyn Fn(i16) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// gc runs with the shared lake-job context.
pub use crate::job::Context;

/// gc options.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// Schema names or ids; empty = every registered schema.
    pub schemas: Vec<String>,
    /// How long an orphan must have been seen, and have existed, before it is deleted.
    pub grace: Duration,
    /// Report only: delete nothing, record nothing.
    pub dry_run: bool,
    /// Requeue the rows of unlisted deltas that the listed state lacks (lost data), so the
    /// next flush lists them.
    pub repair: bool,
    /// The most unlisted-delta rows settled at once ([`SETTLE_ROWS`]; a test sets fewer).
    pub settle_rows: usize,
}

/// The most unlisted-delta rows gc holds at once while settling them (about 130 bytes each
/// with their listed copies): a hundred default flush batches. Lake content decides how many
/// rows the unlisted deltas hold; gc's memory must not follow it (docs/hazards.md S21).
pub const SETTLE_ROWS: usize = 1_000_000;

/// The sighting state next to the manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcState {
    /// Key → when gc first saw it unlisted (epoch ms).
    #[serde(default)]
    pub first_unlisted_ms: BTreeMap<String, i64>,
}

/// Outcome for one schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Nothing unlisted is left that gc may delete.
    Clean,
    /// Orphans remain within the grace period: the next runs delete them.
    Pending,
    /// A person must act: lost data not repaired, an unlisted delta that cannot be read, or
    /// keys of no known shape.
    Attention,
    /// The prefix holds bases but the manifest lists none of them: refused.
    Refused,
    /// Another process holds the schema lock.
    Locked,
    /// gc could not complete.
    Failed,
    /// A stop request (SIGTERM/SIGINT) came before gc reached this schema.
    Stopped,
}

/// Report for one schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct SchemaGc {
    /// Schema id.
    pub schema_id: i16,
    /// Schema name.
    pub schema: String,
    /// Outcome.
    pub outcome: Option<Outcome>,
    /// Deleted (or, in a dry run, deletable) orphans.
    pub deleted: Vec<String>,
    /// Orphans kept because they are within the grace period.
    pub within_grace: Vec<String>,
    /// Unlisted deltas that could not be read (each with why): kept for a person.
    pub unlisted_deltas: Vec<String>,
    /// Unlisted deltas holding rows the listed state lacks: kept, their rows reported.
    pub lost: Vec<settle::LostDelta>,
    /// The lost rows requeued by `--repair` (with `--dry-run`: what would be).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repaired: Option<crate::source::requeue::Requeued>,
    /// Keys of no known shape: never touched.
    pub unknown: Vec<String>,
    /// Manifest history copies deleted (or, in a dry run, deletable): superseded before the
    /// history retention window.
    pub history_deleted: Vec<String>,
    /// Manifest history copies kept (after the deletions).
    pub history_kept: usize,
    /// Writes killed runs started and never finished, undone (or, in a dry run, to undo): S3
    /// multipart uploads aborted, a local lake's temporary files removed (docs/hazards.md L38).
    pub abandoned: Vec<String>,
    /// Why the schema was refused or failed.
    pub reason: Option<String>,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// True for `--dry-run`.
    pub dry_run: bool,
    /// Per schema, by id.
    pub schemas: Vec<SchemaGc>,
}

impl GcReport {
    /// What a scheduler must do: 0 when everything unlisted was deleted or is waiting out its
    /// grace (the state after every compaction), 1 when a schema failed, 3 when a person must
    /// act (lost data not repaired, an unreadable unlisted delta, unknown keys, a refusal) or
    /// a schema was not collected (locked, or skipped by a stop).
    pub fn exit_code(&self) -> i32 {
        let outcomes: Vec<Outcome> = self.schemas.iter().filter_map(|s| s.outcome).collect();
        if outcomes.contains(&Outcome::Failed) {
            1
        } else if outcomes
            .iter()
            .any(|o| !matches!(o, Outcome::Clean | Outcome::Pending))
        {
            3
        } else {
            0
        }
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let verb = if self.dry_run {
            "would delete"
        } else {
            "deleted"
        };
        let mut out = format!(
            "{:<24} {:>6} {:<9} {:>8} {:>8} {:>9} {:>8}\n",
            "SCHEMA", "ID", "OUTCOME", "DELETED", "IN_GRACE", "DELTAS", "UNKNOWN"
        );
        for s in &self.schemas {
            let outcome = s.outcome.map(|o| label(&o)).unwrap_or_default();
            out.push_str(&format!(
                "{:<24} {:>6} {:<9} {:>8} {:>8} {:>9} {:>8}\n",
                s.schema,
                s.schema_id,
                outcome,
                s.deleted.len(),
                s.within_grace.len(),
                s.unlisted_deltas.len(),
                s.unknown.len()
            ));
            for k in &s.deleted {
                out.push_str(&format!(
                    "    {verb} {}\n",
                    crate::report::printable(k, false)
                ));
            }
            for k in &s.within_grace {
                out.push_str(&format!(
                    "    within grace {}\n",
                    crate::report::printable(k, false)
                ));
            }
            for k in &s.unlisted_deltas {
                out.push_str(&format!(
                    "    unlisted delta (unreadable, kept) {}\n",
                    crate::report::printable(k, false)
                ));
            }
            for d in &s.lost {
                out.push_str(&format!(
                    "    LOST {} rows in unlisted delta {} (gc --repair requeues them): {}\n",
                    d.rows,
                    crate::report::printable(&d.key, false),
                    d.ids.join(" ")
                ));
            }
            if let Some(r) = &s.repaired {
                out.push_str(&format!(
                    "    repaired: {} rows requeued ({} re-exported, {} tombstones); the next flush lists them\n",
                    r.count(),
                    r.live.len(),
                    r.tombstones.len()
                ));
            }
            for k in &s.unknown {
                out.push_str(&format!(
                    "    unknown key (untouched) {}\n",
                    crate::report::printable(k, false)
                ));
            }
            for k in &s.history_deleted {
                out.push_str(&format!(
                    "    {verb} history copy {}\n",
                    crate::report::printable(k, false)
                ));
            }
            for k in &s.abandoned {
                out.push_str(&format!(
                    "    {verb} abandoned write {}\n",
                    crate::report::printable(k, false)
                ));
            }
            if s.history_kept > 0 || !s.history_deleted.is_empty() {
                out.push_str(&format!("    history copies kept {}\n", s.history_kept));
            }
            if let Some(r) = &s.reason {
                out.push_str(&format!("    {}\n", crate::report::printable(r, false)));
            }
        }
        out
    }
}

/// Refuses a grace shorter than twice [`job::COMMIT_LEASE`]: a compaction may take
/// up to the lease between staging its new base and listing it, and until then gc sees an
/// orphan; a shorter grace could delete a base about to be published.
pub fn check_grace(grace: Duration) -> Result<()> {
    let lease = job::COMMIT_LEASE;
    let least = lease * 2;
    if grace < least {
        return Err(Error::setting(
            "grace",
            format!(
                "must be at least {}m: a compaction may take up to {}m between staging its new base and listing it",
                least.as_secs() / 60,
                lease.as_secs() / 60
            ),
        ));
    }
    Ok(())
}

/// Runs gc over the selected schemas (the grace is checked first: [`check_grace`]).
pub async fn run(ctx: &Context, opts: &GcOptions) -> Result<GcReport> {
    run_hooked(ctx, opts, None).await
}

/// [`run`] with a test seam (the `testing` feature only: docs/security.md).
#[cfg(any(test, feature = "testing"))]
pub async fn run_with_hook(ctx: &Context, opts: &GcOptions, hook: SettleHook) -> Result<GcReport> {
    run_hooked(ctx, opts, Some(&hook)).await
}

async fn run_hooked(
    ctx: &Context,
    opts: &GcOptions,
    hook: Option<&SettleHook>,
) -> Result<GcReport> {
    check_grace(opts.grace)?;
    let source = &job::source_guard(ctx).await?;
    let schemas = job::each_schema(
        ctx,
        &opts.schemas,
        |reg| async move { gc_schema(ctx, opts, source, &reg, hook).await },
        |reg| SchemaGc {
            schema_id: reg.id,
            schema: reg.name,
            outcome: Some(Outcome::Stopped),
            ..SchemaGc::default()
        },
    )
    .await?;
    let report = GcReport {
        dry_run: opts.dry_run,
        schemas,
    };
    tracing::info!(
        schemas = report.schemas.len(),
        deleted = report
            .schemas
            .iter()
            .map(|s| s.deleted.len())
            .sum::<usize>(),
        history_deleted = report
            .schemas
            .iter()
            .map(|s| s.history_deleted.len())
            .sum::<usize>(),
        dry_run = opts.dry_run,
        exit_code = report.exit_code(),
        "gc done"
    );
    Ok(report)
}

async fn gc_schema(
    ctx: &Context,
    opts: &GcOptions,
    source: &SourceGuard,
    reg: &Registered,
    hook: Option<&SettleHook>,
) -> SchemaGc {
    let started = Instant::now();
    let mut out = SchemaGc {
        schema_id: reg.id,
        schema: reg.name.clone(),
        ..SchemaGc::default()
    };
    let result = job::with_lock_or_plan(ctx, reg.id, opts.dry_run, async |lock| {
        collect(ctx, opts, source, lock, reg.id, &mut out, hook).await
    })
    .await;
    match result {
        Ok(Some(())) => {}
        Ok(None) => out.outcome = Some(Outcome::Locked),
        Err(e) => {
            out.outcome = Some(Outcome::Failed);
            out.reason = Some(job::failed("gc", &reg.name, e.chain()));
        }
    }
    out.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    out
}

/// What the manifest says about the schema's prefix.
#[derive(Debug, Default)]
struct ListedState {
    /// The keys it lists.
    keys: BTreeSet<String>,
    /// The keys it records as retired (merged into a listed base or replaced by init, so
    /// deletable after the grace period), with when.
    retired: BTreeMap<String, i64>,
    /// Its entries.
    files: Vec<FileEntry>,
}

/// The listed state, or the refusal of a manifest naming a path that is not a data file of
/// the schema, or another source database than `source`'s.
type Listed = std::result::Result<ListedState, String>;

async fn listed(ctx: &Context, source: &SourceGuard, schema_id: i16) -> Result<Listed> {
    let layout = &ctx.lake.layout;
    let key = layout.manifest_key(schema_id);
    let store = ctx.lake.store.as_ref();
    Ok(
        match manifest::load_within(store, &key, schema_id, layout.limits()).await? {
            None => Ok(Default::default()),
            Some(l) => match (
                l.manifest.foreign_path(layout),
                source.check(&key, l.manifest.source.as_ref()),
            ) {
                (Some(foreign), _) => Err(format!(
                    "manifest {key} lists or retires {foreign}: refusing to collect this prefix until the entry is removed"
                )),
                (None, Err(e)) => Err(e.to_string()),
                (None, Ok(())) => Ok(ListedState {
                    keys: l.manifest.files.iter().map(|f| f.path.clone()).collect(),
                    retired: l.manifest.retired_since(),
                    files: l.manifest.files,
                }),
            },
        },
    )
}

/// What gc will do to one schema: plain data, printed by a dry run and carried out by a real
/// one ([`execute`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct GcPlan {
    /// Why the prefix is refused (nothing is done).
    refused: Option<String>,
    /// Orphans past their grace: deleted.
    due: Vec<String>,
    /// Orphans within their grace: kept.
    within_grace: Vec<String>,
    /// Unlisted deltas that could not be read: reported, never deleted.
    unlisted_deltas: Vec<String>,
    /// Unlisted deltas holding rows the listed state lacks: reported, kept.
    lost: Vec<settle::LostDelta>,
    /// Keys of no known shape: never touched.
    unknown: Vec<String>,
    /// The sightings recorded, as loaded.
    state: GcState,
    /// The etag of the state loaded, for its conditional save.
    state_etag: Option<String>,
    /// The state loaded named keys outside the schema (dropped from `state`): save it anew.
    state_foreign: bool,
    /// The sightings to record: every deletable orphan still present.
    seen: BTreeMap<String, i64>,
    /// The manifest's retired paths.
    retired: BTreeSet<String>,
    /// Retired paths whose objects are gone already.
    retired_absent: BTreeSet<String>,
    /// Manifest history copies past the retention: deleted.
    history: history::Prune,
    /// Writes started before [`ABANDONED_AGE`] (and the grace) and never finished: undone.
    abandoned: Vec<crate::store::AbandonedWrite>,
}

/// How old an unfinished write must be before gc undoes it (and at least the grace): no
/// upload of one file takes this long, and one aborted anyway fails its run, which publishes
/// nothing.
const ABANDONED_AGE: Duration = Duration::from_secs(3600);

impl GcPlan {
    fn refused(why: String) -> Self {
        Self {
            refused: Some(why),
            ..Self::default()
        }
    }
}

async fn collect(
    ctx: &Context,
    opts: &GcOptions,
    source: &SourceGuard,
    lock: &SchemaLock,
    schema_id: i16,
    out: &mut SchemaGc,
    hook: Option<&SettleHook>,
) -> Result<()> {
    let mut plan = plan(ctx, opts, source, schema_id, hook).await?;
    if let Some(why) = plan.refused.take() {
        out.outcome = Some(Outcome::Refused);
        out.reason = Some(why);
        return Ok(());
    }
    // The plan was made under the lock; it is acted on (requeues, deletes, sightings) only
    // while the lock is still held (docs/hazards.md L68). Asked once per schema, so the
    // server is asked, as init and verify's repair do. A dry run acts on nothing and gave the
    // lock back (docs/hazards.md L106).
    if !opts.dry_run {
        lock.ensure_held().await?;
    }
    out.unlisted_deltas = std::mem::take(&mut plan.unlisted_deltas);
    out.lost = std::mem::take(&mut plan.lost);
    if opts.repair && !out.lost.is_empty() {
        // The lost rows get dirty slots above every copy (docs/design.md §10): the next flush
        // lists them, after which the orphan is covered and deleted past its grace.
        let rows: Vec<_> = out.lost.iter().flat_map(|d| d.requeue.clone()).collect();
        let mut client = ctx.connector.connect().await?;
        let now = ctx.clock.now_ms();
        out.repaired = Some(
            crate::source::repair::requeue_source(
                &mut client,
                &ctx.tables,
                schema_id,
                &rows,
                now,
                opts.dry_run,
            )
            .await?,
        );
    }
    out.unknown = std::mem::take(&mut plan.unknown);
    out.within_grace = plan.within_grace.clone();
    let failed = if opts.dry_run {
        Vec::new()
    } else {
        execute(ctx, schema_id, &plan).await?
    };
    out.within_grace
        .extend(failed.iter().filter(|k| plan.due.contains(k)).cloned());
    out.history_deleted = plan
        .history
        .due
        .iter()
        .filter(|k| !failed.contains(k))
        .cloned()
        .collect();
    out.history_kept = plan.history.kept + (plan.history.due.len() - out.history_deleted.len());
    out.abandoned = plan
        .abandoned
        .iter()
        .map(|w| w.key.clone())
        .filter(|k| !failed.contains(k))
        .collect();
    out.deleted = plan
        .due
        .into_iter()
        .filter(|k| !failed.contains(k))
        .collect();
    let repaired = out.repaired.is_some() && !opts.dry_run;
    out.outcome = Some(
        if !out.unlisted_deltas.is_empty()
            || !out.unknown.is_empty()
            || (!out.lost.is_empty() && !repaired)
        {
            Outcome::Attention
        } else if out.within_grace.is_empty() && out.lost.is_empty() {
            Outcome::Clean
        } else {
            Outcome::Pending
        },
    );
    Ok(())
}

/// Steps 1–3: the owner check, the listing with its classification against the manifest,
/// and the sightings; nothing is written.
async fn plan(
    ctx: &Context,
    opts: &GcOptions,
    source: &SourceGuard,
    schema_id: i16,
    hook: Option<&SettleHook>,
) -> Result<GcPlan> {
    let store = ctx.lake.store.as_ref();
    let layout = &ctx.lake.layout;
    let prefix = layout.schema_prefix(schema_id);
    if let owner::Ownership::Other(why) = owner::check(store, layout, schema_id).await? {
        return Ok(GcPlan::refused(why));
    }
    let ListedState {
        keys: listed_keys,
        retired,
        files,
    } = match listed(ctx, source, schema_id).await? {
        Ok(listed) => listed,
        Err(why) => return Ok(GcPlan::refused(why)),
    };
    let objects = store
        .list(&prefix)
        .await
        .map_err(Error::storage("list schema prefix", prefix.clone()))?;
    // #463: bases present, none listed in this prefix → the manifest is not this prefix's.
    let has_bases = objects.iter().any(|o| layout.classify(&o.key).is_base());
    if has_bases && !listed_keys.iter().any(|k| k.starts_with(&prefix)) {
        return Ok(GcPlan::refused(format!(
            "{prefix} holds base files but manifest {} lists none of them: check --lake, --data-prefix and --manifest-template before any gc",
            layout.manifest_key(schema_id)
        )));
    }
    let (state, state_etag, state_foreign) = load_state(store, layout, schema_id).await?;
    let mut plan = GcPlan {
        state,
        state_etag,
        state_foreign,
        ..GcPlan::default()
    };
    let now = ctx.clock.now_ms();
    let clock = Sighting {
        now,
        grace_ms: i64::try_from(opts.grace.as_millis()).unwrap_or(i64::MAX),
        retention_ms: i64::try_from(layout.history_retention().as_millis()).unwrap_or(i64::MAX),
    };
    let mut orphans = Vec::new();
    for o in objects.iter().filter(|o| !listed_keys.contains(&o.key)) {
        let kind = layout.classify(&o.key);
        let ours = kind.schema_id() == Some(schema_id);
        let retired_at = retired.get(&o.key).copied();
        let deletable = match kind {
            // Garbage by shape, or a delta that compaction merged and retired.
            KeyKind::Tmp { .. } | KeyKind::MergedBase { .. } | KeyKind::InitBase { .. } => ours,
            KeyKind::Delta { .. } => ours && retired_at.is_some(),
            _ => false,
        };
        match kind {
            _ if deletable => clock.sight(&mut plan, o, retired_at),
            KeyKind::Delta { .. } if ours => orphans.push(o.clone()),
            KeyKind::Owner { .. } if ours => {}
            _ => plan.unknown.push(o.key.clone()),
        }
    }
    // Unlisted deltas: deletable once every row is covered by the listed state.
    let verdicts = settle::settle(ctx, schema_id, &files, &orphans, hook, opts.settle_rows).await?;
    for (o, v) in orphans.iter().zip(verdicts) {
        match v {
            settle::Verdict::Covered => clock.sight(&mut plan, o, None),
            settle::Verdict::Lost(l) => plan.lost.push(l),
            settle::Verdict::Unreadable(why) => {
                tracing::warn!(key = %o.key, why, "unlisted delta cannot be read; kept");
                plan.unlisted_deltas.push(o.key.clone());
            }
        }
    }
    if !plan.seen.is_empty() {
        // Second look: a writer may have listed a key since the first load (it was being
        // committed while the prefix was listed). Such a key is neither deleted nor sighted:
        // a sighting kept from before it was listed would cut its grace short once it is
        // unlisted again.
        let relisted = match listed(ctx, source, schema_id).await? {
            Ok(listed) => listed.keys,
            Err(why) => return Ok(GcPlan::refused(why)),
        };
        plan.due.retain(|k| !relisted.contains(k));
        plan.seen.retain(|k, _| !relisted.contains(k));
        plan.within_grace.retain(|k| !relisted.contains(k));
    }
    let present: BTreeSet<&String> = objects.iter().map(|o| &o.key).collect();
    plan.retired = retired.into_keys().collect();
    plan.retired_absent = plan
        .retired
        .iter()
        .filter(|k| !present.contains(k))
        .cloned()
        .collect();
    plan.history = history::prune_plan(store, layout, schema_id, now).await?;
    plan.abandoned = abandoned(ctx, schema_id, now, opts.grace).await;
    Ok(plan)
}

/// The writes under the schema's data prefix and beside its manifest that a killed run
/// started before the grace and [`ABANDONED_AGE`] and nobody finished.
async fn abandoned(
    ctx: &Context,
    schema_id: i16,
    now: i64,
    grace: Duration,
) -> Vec<crate::store::AbandonedWrite> {
    let store = ctx.lake.store.as_ref();
    let layout = &ctx.lake.layout;
    let age = i64::try_from(grace.max(ABANDONED_AGE).as_millis()).unwrap_or(i64::MAX);
    let manifest_key = layout.manifest_key(schema_id);
    let mut prefixes = vec![layout.schema_prefix(schema_id)];
    // A local lake's manifest writes leave their temporary files beside it (not at the lake's
    // root, which would walk every schema's files); S3 manifests are never multipart.
    if store.is_local()
        && let Some((dir, _)) = manifest_key.rsplit_once('/')
    {
        prefixes.push(format!("{dir}/"));
    }
    let mut out = Vec::new();
    for prefix in prefixes {
        // Housekeeping: a store that cannot list them (no permission for it, a server
        // without the operation) does not fail the run.
        let found = match store.abandoned_writes(&prefix).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(prefix, error = %e, "could not list unfinished writes; none undone (a bucket lifecycle rule can abort them: docs/operations.md)");
                continue;
            }
        };
        // Only writes of this schema's own keys (an upload to a key of another shape is
        // another writer's), or a local lake's temporaries, named by the store alone.
        let ours = |w: &crate::store::AbandonedWrite| {
            let local_temporary = store.is_local()
                && w.key
                    .rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with(".lakecdc-tmp-"));
            local_temporary || layout.classify(&w.key).schema_id() == Some(schema_id)
        };
        out.extend(
            found
                .into_iter()
                .filter(|w| ours(w) && now.saturating_sub(w.started_ms) >= age),
        );
    }
    out
}

/// Steps 4–7: delete the due orphans, save the sightings (conditionally), drop the retired
/// paths whose objects are gone from the manifest, and delete the history copies past the
/// retention. Returns the keys whose delete failed (kept for the next run).
async fn execute(ctx: &Context, schema_id: i16, plan: &GcPlan) -> Result<Vec<String>> {
    let store = ctx.lake.store.as_ref();
    let layout = &ctx.lake.layout;
    let mut seen = plan.seen.clone();
    let mut failed = Vec::new();
    let mut gone = plan.retired_absent.clone();
    for key in &plan.due {
        match store.delete(key).await {
            Ok(()) => {
                seen.remove(key);
                if plan.retired.contains(key) {
                    gone.insert(key.clone());
                }
            }
            Err(source) => {
                tracing::warn!(key, error = %source, "gc delete failed; retried next run");
                failed.push(key.clone());
            }
        }
    }
    let new_state = GcState {
        first_unlisted_ms: seen,
    };
    if new_state != plan.state || plan.state_foreign {
        let key = layout.gc_state_key(schema_id);
        save_state(store, &key, &new_state, plan.state_etag.clone()).await?;
    }
    if !gone.is_empty() {
        let clock = ctx.clock.as_ref();
        manifest::commit_within(store, layout, schema_id, clock, Default::default(), |m| {
            m.forget_retired(&gone);
            Ok(())
        })
        .await?;
    }
    // Last: a copy is only ever deleted once the files its version alone listed are.
    for key in &plan.history.due {
        if let Err(source) = store.delete(key).await {
            tracing::warn!(key, error = %source, "gc could not delete a manifest history copy; retried next run");
            failed.push(key.clone());
        }
    }
    for w in &plan.abandoned {
        if let Err(source) = store.remove_abandoned(w).await {
            tracing::warn!(key = %w.key, error = %source, "gc could not undo an abandoned write; retried next run");
            failed.push(w.key.clone());
        }
    }
    Ok(failed)
}

/// The time a sighting is judged at.
struct Sighting {
    now: i64,
    grace_ms: i64,
    /// The manifest history retention: how long a retired file is kept past its retirement.
    retention_ms: i64,
}

impl Sighting {
    /// Records a deletable orphan's sighting and files it as due or within the grace. It is
    /// due when the object, its first sighting and its retirement (when a manifest retired it)
    /// are all older than the grace: a file retired after an earlier sighting still gets its
    /// whole grace, for readers of the manifests that listed it. A retired file is also kept
    /// until its retirement is older than the history retention, for readers of the history
    /// copies that list it ([`kept_for_history`]).
    fn sight(&self, plan: &mut GcPlan, o: &crate::store::ObjectMeta, retired_at: Option<i64>) {
        let (now, grace_ms) = (self.now, self.grace_ms);
        let first = plan
            .state
            .first_unlisted_ms
            .get(&o.key)
            .copied()
            .unwrap_or(now);
        plan.seen.insert(o.key.clone(), first);
        let since = grace_start(first, retired_at, now, grace_ms);
        if retired_at.is_some_and(|r| r > now.saturating_add(grace_ms)) {
            tracing::warn!(key = %o.key, retired_at, now, "retirement stamped in the future (a writer's clock is ahead); its grace counts from the first sighting");
        }
        // Times read from the lake (sightings, retirements): saturating, never overflowing.
        if now.saturating_sub(since) >= grace_ms
            && now.saturating_sub(o.last_modified_ms) >= grace_ms
            && !kept_for_history(retired_at, now, grace_ms, self.retention_ms)
        {
            plan.due.push(o.key.clone());
        } else {
            plan.within_grace.push(o.key.clone());
        }
    }
}

/// When a deletable orphan's grace starts: its first sighting, or its retirement when that is
/// later. A retirement a little ahead of this clock (writers' clocks differ) counts from now;
/// one more than a grace ahead is not believed (a wrong clock or unit), so it cannot keep the
/// file forever.
fn grace_start(first: i64, retired_at: Option<i64>, now: i64, grace_ms: i64) -> i64 {
    match retired_at {
        Some(r) if r > now.saturating_add(grace_ms) => first,
        Some(r) => first.max(r.min(now)),
        None => first,
    }
}

/// Whether a file retired at `retired_at` is still kept for the manifest history: until its
/// retirement is older than the retention (history copies younger than the retention may list
/// it; see the module doc). A retirement more than the longer of the grace and the retention
/// ahead of this clock is not believed (as in [`grace_start`]).
fn kept_for_history(retired_at: Option<i64>, now: i64, grace_ms: i64, retention_ms: i64) -> bool {
    match retired_at {
        None => false,
        Some(r) if r > now.saturating_add(grace_ms.max(retention_ms)) => false,
        Some(r) => now.saturating_sub(r) < retention_ms,
    }
}

/// Reads the sightings of the schema (within [`crate::lake::ReadLimits::gc_state_bytes`]),
/// dropping those of keys that are not of the schema's shapes under its prefix: gc only ever
/// consults a sighting for a key it listed there, and the next save leaves them out.
async fn load_state(
    store: &dyn crate::store::ObjectStore,
    layout: &Layout,
    schema_id: i16,
) -> Result<(GcState, Option<String>, bool)> {
    let key = layout.gc_state_key(schema_id);
    let cap = Capped {
        op: "load gc state",
        what: "gc state",
        limit: layout.limits().gc_state_bytes,
        why: "the sightings are corrupt or hostile: remove the object to start sightings afresh",
    };
    let Some(got) = read_capped(store, &key, cap).await? else {
        return Ok((GcState::default(), None, false));
    };
    let mut state: GcState = serde_json::from_slice(&got.bytes).map_err(|e| Error::Manifest {
        key: key.clone(),
        message: format!("gc state is not valid ({e}); remove it to start sightings afresh"),
    })?;
    let sightings = state.first_unlisted_ms.len();
    state.first_unlisted_ms.retain(|k, _| {
        let ours = layout.classify(k).schema_id() == Some(schema_id);
        if !ours {
            tracing::warn!(key = %k, "gc state names a key outside the schema's prefix; ignored");
        }
        ours
    });
    let foreign = state.first_unlisted_ms.len() != sightings;
    Ok((state, Some(got.etag), foreign))
}

async fn save_state(
    store: &dyn crate::store::ObjectStore,
    key: &str,
    state: &GcState,
    etag: Option<String>,
) -> Result<()> {
    let body = serde_json::to_vec_pretty(state).map_err(Error::json("gc state"))?;
    let mode = etag.map_or(PutMode::Create, PutMode::Update);
    store
        .put_bytes(key, Bytes::from(body), mode)
        .await
        .map(|_| ())
        .map_err(Error::storage("save gc state", key))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;

    use super::{GcState, check_grace, grace_start, kept_for_history, load_state};
    use crate::error::Error;
    use crate::lake::{Layout, ReadLimits};
    use crate::store::fault::{FaultStore, Op};
    use crate::store::memory::MemoryStore;
    use crate::store::{ObjectStore, PutMode};

    #[tokio::test]
    async fn sightings_are_read_within_the_limit_and_only_for_the_schemas_keys() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let layout = Layout::new("", "data", "manifest/{schema_id}.json").unwrap();
        let ours = layout.tmp_key(7, uuid::Uuid::new_v4());
        let foreign = [
            layout.tmp_key(8, uuid::Uuid::new_v4()),
            format!("other/7/_tmp/{}.parquet", uuid::Uuid::new_v4()),
            format!("data/7/../8/base-{}.parquet", uuid::Uuid::now_v7()),
        ];
        let mut state = GcState::default();
        state.first_unlisted_ms.insert(ours.clone(), 5);
        for k in &foreign {
            state.first_unlisted_ms.insert(k.clone(), i64::MIN);
        }
        let body = serde_json::to_vec_pretty(&state).unwrap();
        let size = body.len() as u64;
        store
            .put_bytes(
                &layout.gc_state_key(7),
                Bytes::from(body),
                PutMode::Overwrite,
            )
            .await
            .unwrap();
        let (loaded, etag, foreign_seen) = load_state(&store, &layout, 7).await.unwrap();
        assert_eq!(loaded.first_unlisted_ms, [(ours, 5)].into());
        assert!(etag.is_some() && foreign_seen);
        // Over the limit: refused by the one capped read.
        let small = layout.clone().with_limits(ReadLimits {
            gc_state_bytes: size - 1,
            ..ReadLimits::default()
        });
        let before = store.calls().len();
        let err = load_state(&store, &small, 7).await.unwrap_err();
        assert!(
            matches!(&err, Error::TooLarge { what: "gc state", size: s, .. } if *s == size),
            "{err:?}"
        );
        let ops: Vec<Op> = store.calls()[before..].iter().map(|c| c.op).collect();
        assert_eq!(ops, [Op::GetBytes]);
    }

    const GRACE: i64 = 15 * 60_000;

    #[test]
    fn a_grace_shorter_than_two_compaction_leases_is_refused() {
        let err = check_grace(Duration::from_secs(10 * 60 - 1)).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(
            err.to_string().contains("grace must be at least 10m"),
            "{err}"
        );
        assert!(check_grace(Duration::from_secs(10 * 60)).is_ok());
    }

    #[test]
    fn a_retired_file_is_kept_for_the_history_retention() {
        const DAY: i64 = 24 * 60 * 60_000;
        let now = 100 * DAY;
        assert!(!kept_for_history(None, now, GRACE, DAY), "not retired");
        assert!(kept_for_history(Some(now - DAY + 1), now, GRACE, DAY));
        assert!(!kept_for_history(Some(now - DAY), now, GRACE, DAY));
        assert!(
            kept_for_history(Some(now + 60_000), now, GRACE, DAY),
            "a little ahead"
        );
        assert!(
            !kept_for_history(Some(now + 2 * DAY), now, GRACE, DAY),
            "far ahead"
        );
        assert!(
            !kept_for_history(Some(now - 60_000), now, GRACE, 0),
            "history off"
        );
    }

    #[test]
    fn the_grace_starts_at_the_later_of_sighting_and_retirement() {
        let now = 100 * GRACE;
        // Not retired: the first sighting.
        assert_eq!(
            grace_start(now - 2 * GRACE, None, now, GRACE),
            now - 2 * GRACE
        );
        // Retired after an early sighting: the retirement.
        assert_eq!(
            grace_start(now - 2 * GRACE, Some(now - 60_000), now, GRACE),
            now - 60_000
        );
        // Retired before it was sighted: the sighting.
        assert_eq!(
            grace_start(now - 60_000, Some(now - 2 * GRACE), now, GRACE),
            now - 60_000
        );
        // A writer's clock a little ahead: from now.
        assert_eq!(
            grace_start(now - 2 * GRACE, Some(now + 60_000), now, GRACE),
            now
        );
        // Far ahead (a wrong clock or unit): not believed, so the file is not kept forever.
        assert_eq!(
            grace_start(now - 2 * GRACE, Some(now * 1000), now, GRACE),
            now - 2 * GRACE
        );
    }
}
