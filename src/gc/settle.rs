//! Settling unlisted deltas (docs/design.md §4.4): a delta that no manifest lists is the
//! leftover of a flush whose manifest save was ambiguous (or failed after landing). Each of its
//! rows is **covered** when the listed state holds that row at a version at least the
//! orphan's, when the row is pending at its source (the next flush brings a newer copy),
//! when the orphan's copy is a tombstone and the listed state has the row deleted or absent,
//! or when the listed state has the row deleted or absent and the source no longer holds it
//! (the orphan's live copy is stale: the deletion went out and a compaction or an init
//! dropped its tombstone).
//! An orphan whose rows are all covered loses nothing when deleted; one holding a row that is
//! not covered is **lost data**: its rows are reported (and requeued by `gc --repair`). An
//! orphan whose content cannot be read is left for a person; a store that fails while
//! reading it fails the run, whose next one reads it again (docs/hazards.md L69).

use std::sync::Arc;

use serde::Serialize;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::job::Context;
use crate::lake::current::{CurrentState, listed_copies};
use crate::lake::manifest::{FileEntry, Tier};
use crate::source::requeue::Requeue;
use crate::store::ObjectMeta;

/// The largest unlisted delta gc reads: far above what one flush batch writes. A larger one is
/// not a flush's and is left for a person.
pub(super) const MAX_ORPHAN_BYTES: u64 = 1 << 30;

/// What an unlisted delta holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Every row is covered by the listed state: deletable past the grace.
    Covered,
    /// Rows the listed state lacks.
    Lost(LostDelta),
    /// It could not be read: why.
    Unreadable(String),
}

/// An unlisted delta holding rows the listed state lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LostDelta {
    /// The object key.
    pub key: String,
    /// Rows of it that are not covered.
    pub rows: u64,
    /// Their ids (the first 100).
    pub ids: Vec<String>,
    /// Every uncovered row, with the version its requeue must exceed.
    #[serde(skip)]
    pub requeue: Vec<Requeue>,
}

/// One orphan row: id, version, tombstone, orphan index.
type OrphanRow = (u128, i64, bool, usize);

/// The verdict on each of `orphans` (unlisted deltas of `schema_id`) against the listed
/// `files`. Orphans are read and settled in groups of at most `max_rows` rows, so memory is
/// bounded by that, not by what the prefix holds (docs/hazards.md S21); an orphan holding more
/// rows alone is left for a person.
pub(super) async fn settle(
    ctx: &Context,
    schema_id: i16,
    files: &[FileEntry],
    orphans: &[ObjectMeta],
    hook: Option<&super::SettleHook>,
    max_rows: usize,
) -> Result<Vec<Verdict>> {
    let mut verdicts: Vec<Option<Verdict>> = vec![None; orphans.len()];
    let group = Group {
        ctx,
        schema_id,
        files,
        orphans,
        hook,
    };
    let mut rows: Vec<OrphanRow> = Vec::new();
    for (i, o) in orphans.iter().enumerate() {
        if o.size > MAX_ORPHAN_BYTES {
            verdicts[i] = Some(Verdict::Unreadable(format!(
                "{} bytes, more than any flush writes ({MAX_ORPHAN_BYTES}): not read",
                o.size
            )));
            continue;
        }
        match read_orphan(ctx, o, max_rows).await {
            Ok(Some(r)) => {
                if rows.len().saturating_add(r.len()) > max_rows {
                    group
                        .settle(std::mem::take(&mut rows), &mut verdicts)
                        .await?;
                }
                rows.extend(r.into_iter().map(|(id, v, t)| (id, v, t, i)));
            }
            Ok(None) => {
                verdicts[i] = Some(Verdict::Unreadable(format!(
                    "holds more than {max_rows} rows, more than gc settles at once: not settled"
                )));
            }
            Err(e) if store_failed(&e) => return Err(e),
            Err(e) => verdicts[i] = Some(Verdict::Unreadable(e.chain())),
        }
    }
    group.settle(rows, &mut verdicts).await?;
    Ok(verdicts
        .into_iter()
        .map(|v| v.unwrap_or(Verdict::Covered))
        .collect())
}

/// What settling a group of orphan rows needs.
struct Group<'a> {
    ctx: &'a Context,
    schema_id: i16,
    files: &'a [FileEntry],
    orphans: &'a [ObjectMeta],
    hook: Option<&'a super::SettleHook>,
}

impl Group<'_> {
    /// Settles `rows` (every row of the orphans they name): each such orphan holding a row
    /// that is not covered gets its [`Verdict::Lost`]; the others stay `None` (covered).
    async fn settle(
        &self,
        mut rows: Vec<OrphanRow>,
        verdicts: &mut [Option<Verdict>],
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        for (i, l) in self.lost(&mut rows).await?.into_iter().enumerate() {
            if let Some(l) = l {
                verdicts[i] = Some(Verdict::Lost(l));
            }
        }
        Ok(())
    }

    /// The orphans (by index) holding rows of `rows` that are not covered.
    async fn lost(&self, rows: &mut [OrphanRow]) -> Result<Vec<Option<LostDelta>>> {
        let (ctx, schema_id, files, orphans, hook) = (
            self.ctx,
            self.schema_id,
            self.files,
            self.orphans,
            self.hook,
        );
        rows.sort_unstable();
        // The newest listed copy of each orphan row.
        let sorted: Vec<u128> = rows.iter().map(|r| r.0).collect();
        let listed = listed_copies(ctx.lake.store.clone(), files, &sorted).await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| Uuid::from_u128(r.0)).collect();
        let client = ctx.connector.connect().await?;
        // The registry is read once for both questions asked of the source.
        let source = crate::source::repair::Source::of(&client, &ctx.tables, schema_id).await?;
        let dirty = source.pending_among(&client, &ctx.tables, &ids).await?;
        let covered_by_lake = |(r, l): (&OrphanRow, &Option<(i64, bool)>)| {
            let (id, version, tombstone, _) = *r;
            dirty.contains(&id)
                || match l {
                    Some((v, t)) => *v >= version || (tombstone && *t),
                    None => tombstone,
                }
        };
        // A live copy of a row the lake has absent or deleted is stale when the source no longer
        // holds the row either: its deletion was exported, then dropped by a compaction or an init
        // (which keep no tombstones in bases). Asked after the pending rows, so a row deleted in
        // between is pending and its tombstone goes out; one inserted in between is asked about
        // again below.
        let gone_from_lake: Vec<Uuid> = rows
            .iter()
            .zip(&listed)
            .filter(|(r, l)| !covered_by_lake((r, l)) && l.is_none_or(|(_, t)| t))
            .map(|(r, _)| Uuid::from_u128(r.0))
            .collect();
        if let Some(hook) = hook
            && !gone_from_lake.is_empty()
        {
            hook(schema_id).await;
        }
        let live: std::collections::BTreeSet<u128> = if gone_from_lake.is_empty() {
            Default::default()
        } else {
            // Unanswered (a hashed key's table scan timing out, the table gone), every such row
            // counts as live: reported lost, never deleted on a guess.
            source
            .live_among(&client, &ctx.tables, &gone_from_lake)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(schema_id, error = %e.chain(), "could not ask the source which rows it still holds; their orphans are kept");
                gone_from_lake.iter().map(|id| id.as_u128()).collect()
            })
        };
        // A row inserted or recreated between the two questions holds a dirty slot now (written
        // in its insert's transaction), which no flush can mark while gc holds the schema lock:
        // it is pending, its next copy goes out, and the orphan's is covered (docs/hazards.md L78).
        let live_ids: Vec<Uuid> = live.iter().map(|id| Uuid::from_u128(*id)).collect();
        let pending_since = if live_ids.is_empty() {
            Default::default()
        } else {
            source
            .pending_among(&client, &ctx.tables, &live_ids)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(schema_id, error = %e.chain(), "could not ask the source again which rows are pending; their orphans are kept");
                Default::default()
            })
        };
        let mut lost: Vec<Option<LostDelta>> = vec![None; orphans.len()];
        for (r, l) in rows.iter().zip(&listed) {
            let (id, version, _, i) = *r;
            let stale = l.is_none_or(|(_, t)| t) && !live.contains(&id);
            if covered_by_lake((r, l)) || stale || pending_since.contains(&id) {
                continue;
            }
            let d = lost[i].get_or_insert_with(|| LostDelta {
                key: orphans[i].key.clone(),
                rows: 0,
                ids: Vec::new(),
                requeue: Vec::new(),
            });
            d.rows += 1;
            if d.ids.len() < 100 {
                d.ids.push(Uuid::from_u128(id).to_string());
            }
            d.requeue.push(Requeue {
                row_id: Uuid::from_u128(id),
                floor: version.max(l.map_or(0, |(v, _)| v)),
            });
        }
        Ok(lost)
    }
}

/// Whether reading an orphan failed in the store (unreachable, timed out, refused) rather than
/// on the object itself: a person is asked to act on the object only, never on a network blip.
fn store_failed(e: &Error) -> bool {
    matches!(e, Error::Storage { source, .. } if !source.is_about_the_object())
}

/// The rows of an unlisted delta: `(row_id, changed_at, tombstone)` in `row_id` order;
/// `None` once it holds more than `max_rows`.
async fn read_orphan(
    ctx: &Context,
    o: &ObjectMeta,
    max_rows: usize,
) -> Result<Option<Vec<(u128, i64, bool)>>> {
    let entry = FileEntry {
        tier: Tier::Delta,
        path: o.key.clone(),
        row_id_min: String::new(),
        row_id_max: String::new(),
        created_min: 0,
        created_max: 0,
        size_bytes: i64::try_from(o.size).unwrap_or(i64::MAX),
        row_count: 0,
        checksum: None,
        columns: None,
        extra: Default::default(),
    };
    let store: Arc<dyn crate::store::ObjectStore> = ctx.lake.store.clone();
    let mut state = CurrentState::new(store, vec![entry], None);
    let mut out = Vec::new();
    loop {
        let chunk = state.next_chunk(64 * 1024).await?;
        if chunk.is_empty() {
            return Ok(Some(out));
        }
        if out.len().saturating_add(chunk.len()) > max_rows {
            return Ok(None);
        }
        out.extend(
            chunk
                .into_iter()
                .map(|c| (c.row_id, c.changed_at, c.tombstone)),
        );
    }
}
