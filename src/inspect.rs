//! `lakecdc inspect`: per schema, what each job would do now — read-only: no lock is taken and
//! nothing is written anywhere. Dirty rows and the age of the oldest, whether flush would run
//! and why, the lock holder (from `pg_locks` and `pg_stat_activity`), the manifest per tier,
//! the dirty ratio and compaction decision, unlisted objects by class, the manifest history
//! kept (the range `--as-of` can read), and a warning when the `change_log` index is missing.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::job::{self, Context};
use crate::lake::KeyKind;
use crate::lake::history::{self, HistoryRange};
use crate::lake::manifest::{self, Manifest, Tier};
use crate::lake::ranges;
use crate::policy::{CompactThresholds, FlushThresholds, Plan};
use crate::report::label;
use crate::source::ddl;
use crate::source::lock::{self, LockHolder};
use crate::source::registry::{Kind, Registered};

/// Files, rows and bytes of one tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TierSummary {
    /// Listed files.
    pub files: usize,
    /// Rows in them.
    pub rows: i64,
    /// Bytes.
    pub bytes: i64,
}

/// What inspect found for one schema.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct SchemaInspect {
    /// Schema id.
    pub schema_id: i16,
    /// Schema name.
    pub schema: String,
    /// Dirty rows.
    pub dirty_rows: i64,
    /// Age of the oldest dirty row in seconds (0 when none; negative when ahead of the clock).
    pub oldest_dirty_age_s: i64,
    /// Whether a flush run now (without --force) would export this schema.
    pub flush_would_run: bool,
    /// Why (not).
    pub flush_reason: String,
    /// The session holding the schema lock, if any.
    pub lock_holder: Option<LockHolder>,
    /// Whether the schema has a manifest.
    pub manifest: bool,
    /// Manifest version.
    pub manifest_version: i64,
    /// Base tier.
    pub base: TierSummary,
    /// Delta tier.
    pub delta: TierSummary,
    /// Compaction plan (decision, dirty ratio and the numbers behind it).
    pub compaction: Option<Plan>,
    /// Unlisted objects by class: tmp, merged_base, init_base, delta, retired, unknown.
    pub unlisted: BTreeMap<&'static str, usize>,
    /// The manifest history kept: its oldest and newest copies and how many (none when no
    /// copy is kept).
    pub history: Option<HistoryRange>,
    /// Why this schema could not be inspected (its other fields are then empty); the other
    /// schemas are still reported.
    pub error: Option<String>,
    /// Why every writer (flush, init, compact, gc) would refuse the schema's lake: its manifest
    /// names another source database (docs/design.md §10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl SchemaInspect {
    /// The report of a schema whose inspection failed.
    fn failed(reg: &Registered, e: &Error) -> Self {
        Self {
            schema_id: reg.id,
            schema: reg.name.clone(),
            error: Some(e.chain()),
            ..Self::default()
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InspectReport {
    /// Per schema, by id.
    pub schemas: Vec<SchemaInspect>,
    /// Problems with the source itself (e.g. a missing index).
    pub warnings: Vec<String>,
}

impl InspectReport {
    /// 0, or 1 when a schema could not be inspected.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.schemas.iter().any(|s| s.error.is_some()))
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for w in &self.warnings {
            out.push_str(&format!(
                "WARNING: {}\n",
                crate::report::printable(w, false)
            ));
        }
        for s in &self.schemas {
            out.push_str(&format!("schema {} (id {})\n", s.schema, s.schema_id));
            if let Some(e) = &s.error {
                out.push_str(&format!(
                    "  error             {}\n",
                    crate::report::printable(e, false)
                ));
                continue;
            }
            if let Some(why) = &s.refused {
                out.push_str(&format!(
                    "  REFUSED           {}\n",
                    crate::report::printable(why, false)
                ));
            }
            out.push_str(&format!(
                "  dirty rows        {} (oldest {}s)\n",
                s.dirty_rows, s.oldest_dirty_age_s
            ));
            out.push_str(&format!(
                "  flush now         {} — {}\n",
                if s.flush_would_run { "yes" } else { "no" },
                s.flush_reason
            ));
            match &s.lock_holder {
                Some(h) => out.push_str(&format!(
                    "  lock              held by pid {} ({}) since {}{}\n",
                    h.pid,
                    h.application_name,
                    crate::lake::history::format_ms(h.since_ms),
                    h.client_addr
                        .as_deref()
                        .map(|a| format!(" from {a}"))
                        .unwrap_or_default()
                )),
                None => out.push_str("  lock              free\n"),
            }
            if s.manifest {
                out.push_str(&format!(
                    "  manifest          version {}; base {} files / {} rows / {} bytes; delta {} files / {} rows / {} bytes\n",
                    s.manifest_version, s.base.files, s.base.rows, s.base.bytes, s.delta.files,
                    s.delta.rows, s.delta.bytes
                ));
            } else {
                let bases = s.unlisted.get("init_base").copied().unwrap_or(0)
                    + s.unlisted.get("merged_base").copied().unwrap_or(0);
                if bases > 0 {
                    // An init killed before its first save, or a lost manifest (L100).
                    out.push_str(&format!(
                        "  manifest          none, but the data prefix holds {bases} base files: lost, or an init killed before its first save (see lakecdc doctor)\n"
                    ));
                } else {
                    out.push_str("  manifest          none (never exported)\n");
                }
            }
            if let Some(p) = &s.compaction {
                let d = label(&p.decision);
                out.push_str(&format!(
                    "  compaction        {d} ({} ranges, dirty ratio {:.4}): {}\n",
                    p.ranges, p.dirty_ratio, p.reason
                ));
                if let Some(line) = p.ranges_line() {
                    out.push_str(&format!("                    {line}\n"));
                }
            }
            match &s.history {
                Some(h) => out.push_str(&format!(
                    "  history           versions {} ({}) to {} ({}), {} copies\n",
                    h.oldest.version,
                    history::format_ms(h.oldest.updated_at_ms),
                    h.newest.version,
                    history::format_ms(h.newest.updated_at_ms),
                    h.count
                )),
                None => out.push_str("  history           none\n"),
            }
            let unlisted: Vec<String> = s
                .unlisted
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            out.push_str(&format!(
                "  unlisted objects  {}\n",
                if unlisted.is_empty() {
                    "none".to_string()
                } else {
                    unlisted.join(", ")
                }
            ));
        }
        out
    }
}

/// Inspects the selected schemas (all registered when `schemas` is empty).
pub async fn run(
    ctx: &Context,
    schemas: &[String],
    flush: &FlushThresholds,
    compact: &CompactThresholds,
) -> Result<InspectReport> {
    let client = ctx.connector.connect().await?;
    let mut warnings = Vec::new();
    if !ddl::change_log_index_exists(&client, &ctx.tables).await? {
        warnings.push(ddl::change_log_index_missing(&ctx.tables));
    }
    let source = job::source_guard_on(ctx, &client).await?;
    let (client, source) = (&client, &source);
    let out = job::each_schema(
        ctx,
        schemas,
        // One schema that cannot be inspected (an unreadable manifest, a failed listing) is
        // reported as such; the others still are.
        |reg| async move {
            Ok(inspect_schema(ctx, client, source, &reg, flush, compact)
                .await
                .unwrap_or_else(|e| SchemaInspect::failed(&reg, &e)))
        },
        |_| Err(Error::Stopped),
    )
    .await?
    .into_iter()
    .collect::<Result<Vec<_>>>()?;
    Ok(InspectReport {
        schemas: out,
        warnings,
    })
}

async fn inspect_schema(
    ctx: &Context,
    client: &tokio_postgres::Client,
    source: &crate::lake::SourceGuard,
    reg: &Registered,
    flush: &FlushThresholds,
    compact: &CompactThresholds,
) -> Result<SchemaInspect> {
    let now = ctx.clock.now_ms();
    let dirty = crate::source::table_source::dirty_of_id(client, &ctx.tables, reg.id).await?;
    let reason = flush.below(dirty.count, dirty.oldest_changed_at, now);
    // A table source the lake no longer follows is refused by flush: say so, with the fix.
    let refused = match reg.kind {
        Kind::Table => crate::source::table_source::load(client, &ctx.tables, reg.id)
            .await?
            .check_flushable()
            .err(),
        _ => None,
    };
    let (flush_would_run, flush_reason) = match (dirty.count, reason, refused) {
        (_, _, Some(e)) => (false, format!("refused: {e}")),
        (0, _, None) => (false, "no dirty rows".to_string()),
        (_, Some(why), None) => (false, why),
        (n, None, None) => (true, flush.due_because(n, dirty.oldest_changed_at, now)),
    };
    let store = ctx.lake.store.as_ref();
    let layout = &ctx.lake.layout;
    let key = layout.manifest_key(reg.id);
    let loaded = manifest::load_within(store, &key, reg.id, layout.limits()).await?;
    // A lake written from another database is refused by every writer: no plan is shown.
    let refused = (loaded.as_ref())
        .and_then(|l| source.check(&key, l.manifest.source.as_ref()).err())
        .map(|e| e.chain());
    let (flush_would_run, flush_reason) = match &refused {
        Some(why) => (false, format!("refused: {why}")),
        None => (flush_would_run, flush_reason),
    };
    // Sums of numbers read from the lake saturate: a total past i64::MAX is shown as i64::MAX,
    // never wrapped (docs/hazards.md S4).
    let tier = |t: Tier| {
        loaded
            .as_ref()
            .map_or(TierSummary::default(), |l| TierSummary {
                files: l.manifest.tier(t).count(),
                rows: Manifest::total_rows(l.manifest.tier(t)),
                bytes: Manifest::total_bytes(l.manifest.tier(t)),
            })
    };
    let listed: std::collections::BTreeSet<String> = loaded
        .as_ref()
        .map(|l| l.manifest.files.iter().map(|f| f.path.clone()).collect())
        .unwrap_or_default();
    let retired = loaded
        .as_ref()
        .map(|l| l.manifest.retired_paths())
        .unwrap_or_default();
    let compaction = match &loaded {
        Some(_) if refused.is_some() => None,
        Some(l) => {
            let (ranges, touched) = ranges::survey(store, layout, reg.id, &l.manifest).await?;
            Some(compact.plan(&l.manifest, &ranges, &touched))
        }
        None => None,
    };
    let prefix = layout.schema_prefix(reg.id);
    let objects = store
        .list(&prefix)
        .await
        .map_err(crate::error::Error::storage("list schema prefix", prefix))?;
    let mut unlisted: BTreeMap<&'static str, usize> = [
        "tmp",
        "merged_base",
        "init_base",
        "delta",
        "retired",
        "unknown",
    ]
    .into_iter()
    .map(|k| (k, 0))
    .collect();
    for o in objects.iter().filter(|o| !listed.contains(&o.key)) {
        let class = match layout.classify(&o.key) {
            _ if retired.contains(&o.key) => "retired",
            KeyKind::Tmp { .. } => "tmp",
            KeyKind::MergedBase { .. } => "merged_base",
            KeyKind::InitBase { .. } => "init_base",
            KeyKind::Delta { .. } => "delta",
            // The prefix's owner marker is not a data file.
            KeyKind::Owner { .. } => continue,
            KeyKind::Unknown => "unknown",
        };
        *unlisted.entry(class).or_default() += 1;
    }
    Ok(SchemaInspect {
        schema_id: reg.id,
        schema: reg.name.clone(),
        dirty_rows: dirty.count,
        oldest_dirty_age_s: if dirty.count > 0 {
            now.saturating_sub(dirty.oldest_changed_at) / 1000
        } else {
            0
        },
        flush_would_run,
        flush_reason,
        lock_holder: lock::holder(client, reg.id).await?,
        manifest: loaded.is_some(),
        manifest_version: loaded.as_ref().map_or(0, |l| l.manifest.version),
        base: tier(Tier::Base),
        delta: tier(Tier::Delta),
        compaction,
        unlisted,
        history: history::range(store, layout, reg.id).await?,
        error: None,
        refused,
    })
}
