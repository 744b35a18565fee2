//! Each schema's state after a run, for its metrics: the dirty rows of `change_log` and the
//! age of the oldest, and the manifest's version and files and bytes per tier. One connection
//! and one manifest read per schema; no listing of the lake.

use crate::error::Result;
use crate::job::Context;
use crate::lake::manifest::{self, Manifest, Tier};

/// Files and bytes of one tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierSize {
    /// Listed files.
    pub files: u64,
    /// Their bytes.
    pub bytes: i64,
}

/// One schema's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchemaState {
    /// Schema id.
    pub schema_id: i16,
    /// Schema name.
    pub schema: String,
    /// Dirty `change_log` rows.
    pub dirty_rows: i64,
    /// Age of the oldest dirty row, seconds (0 when none).
    pub oldest_dirty_age_s: f64,
    /// The manifest's version, when the schema has one.
    pub manifest_version: Option<i64>,
    /// Base tier; `None` when the manifest could not be read.
    pub base: Option<TierSize>,
    /// Delta tier; `None` when the manifest could not be read.
    pub delta: Option<TierSize>,
}

/// The state of `schemas` (id, name) now.
pub async fn gather(ctx: &Context, schemas: &[(i16, String)]) -> Result<Vec<SchemaState>> {
    if schemas.is_empty() {
        return Ok(Vec::new());
    }
    let client = ctx.connector.connect().await?;
    let layout = &ctx.lake.layout;
    let mut out = Vec::with_capacity(schemas.len());
    for (id, name) in schemas {
        let dirty = crate::source::table_source::dirty_of_id(&client, &ctx.tables, *id).await?;
        let now = ctx.clock.now_ms();
        // A manifest that cannot be read (a missing bucket, a damaged file) leaves out this
        // schema's lake samples only: the backlog, from the database, is what an alert on a
        // failing flush needs most (docs/hazards.md L97).
        let loaded = match manifest::load_within(
            ctx.lake.store.as_ref(),
            &layout.manifest_key(*id),
            *id,
            layout.limits(),
        )
        .await
        {
            Ok(loaded) => Some(loaded),
            Err(e) => {
                tracing::warn!(schema = %name, "metrics: the lake samples are left out: {}", e.chain());
                None
            }
        };
        let tier = |t: Tier| {
            loaded.as_ref().map(|l| {
                l.as_ref().map_or(TierSize::default(), |l| TierSize {
                    files: l.manifest.tier(t).count() as u64,
                    bytes: Manifest::total_bytes(l.manifest.tier(t)),
                })
            })
        };
        out.push(SchemaState {
            schema_id: *id,
            schema: name.clone(),
            dirty_rows: dirty.count,
            oldest_dirty_age_s: if dirty.count > 0 {
                (now - dirty.oldest_changed_at) as f64 / 1000.0
            } else {
                0.0
            },
            manifest_version: loaded
                .as_ref()
                .and_then(|l| l.as_ref().map(|l| l.manifest.version)),
            base: tier(Tier::Base),
            delta: tier(Tier::Delta),
        });
    }
    Ok(out)
}
