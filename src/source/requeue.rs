//! Requeueing rows for the next flush (docs/design.md §10): the writer contract applied by
//! lakecdc itself, one transaction per chunk. A row present in the entity table gets its
//! version bumped (`ltbase_updated_at` and its dirty `change_log` slot both set to
//! `GREATEST(now_ms, previous + 1, floor + 1)`), so its re-export wins over every copy in the
//! lake; a soft-deleted row's slot is a tombstone at that version. A row absent from the
//! entity table gets a tombstone slot above every version recorded for it (and above the
//! lake's, its floor). Values are never touched.

use tokio_postgres::Client;
use uuid::Uuid;

use super::READ_TIMEOUT as TIMEOUT;
use super::connect::timed;
use crate::config::Tables;
use crate::error::{Error, Result};

/// Rows requeued in one transaction.
pub const CHUNK: usize = 10_000;

/// One row to requeue: its id and the version its new one must exceed (the lake's copy's
/// version; 0 when unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Requeue {
    /// The row.
    pub row_id: Uuid,
    /// The new version is above this.
    pub floor: i64,
}

/// What requeueing did (or, planned, would do) to a set of rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Requeued {
    /// Rows given a dirty slot with a bumped version (re-exported with their values).
    pub live: Vec<Uuid>,
    /// Rows given a tombstone slot (soft-deleted, or absent from the entity table).
    pub tombstones: Vec<Uuid>,
    /// Rows with no entity row, no `change_log` history and no floor: nothing to requeue.
    pub unknown: Vec<Uuid>,
    /// Rows the application wrote while they were being requeued (made again, deleted, or
    /// given a newer version): its own dirty slot re-exports them, so none was written.
    pub changed: Vec<Uuid>,
}

impl Requeued {
    /// Rows requeued.
    pub fn count(&self) -> usize {
        self.live.len() + self.tombstones.len()
    }

    fn extend(&mut self, other: Requeued) {
        self.live.extend(other.live);
        self.tombstones.extend(other.tombstones);
        self.unknown.extend(other.unknown);
        self.changed.extend(other.changed);
    }
}

/// `rows` sorted by id, each id once with its highest floor.
pub(crate) fn merged(rows: &[Requeue]) -> Vec<Requeue> {
    let mut rows = rows.to_vec();
    rows.sort_by(|a, b| a.row_id.cmp(&b.row_id).then(b.floor.cmp(&a.floor)));
    rows.dedup_by_key(|r| r.row_id);
    rows
}

/// Requeues `rows` of `schema_id` (duplicates merged, the highest floor kept) at `now_ms`, one
/// transaction per [`CHUNK`]; with `dry_run` only classifies them.
pub async fn requeue(
    client: &mut Client,
    tables: &Tables,
    schema_id: i16,
    rows: &[Requeue],
    now_ms: i64,
    dry_run: bool,
) -> Result<Requeued> {
    let rows = merged(rows);
    let mut out = Requeued::default();
    for chunk in rows.chunks(CHUNK) {
        out.extend(requeue_chunk(client, tables, schema_id, chunk, now_ms, dry_run).await?);
    }
    Ok(out)
}

async fn requeue_chunk(
    client: &mut Client,
    tables: &Tables,
    schema_id: i16,
    rows: &[Requeue],
    now_ms: i64,
    dry_run: bool,
) -> Result<Requeued> {
    let (e, cl) = (tables.entity.quoted(), tables.change_log.quoted());
    let ids: Vec<Uuid> = rows.iter().map(|r| r.row_id).collect();
    let floors: Vec<i64> = rows.iter().map(|r| r.floor).collect();
    // Every requeued row's class, and the version it gets: above the entity's version, every
    // version change_log recorded for it, the floor and now.
    let classify = format!(
        "WITH ids AS (SELECT * FROM unnest($2::uuid[], $3::int8[]) AS t(row_id, floor)), \
         known AS (SELECT ids.row_id, ids.floor, \
                (SELECT max(changed_at) FROM {cl} c WHERE c.schema_id = $1 AND c.row_id = ids.row_id) AS logged, \
                e.ltbase_updated_at AS version, e.ltbase_deleted_at IS NOT NULL AS soft, \
                e.ltbase_row_id IS NOT NULL AS present \
            FROM ids LEFT JOIN {e} e ON e.ltbase_schema_id = $1 AND e.ltbase_row_id = ids.row_id) \
         SELECT row_id, present, soft, \
                GREATEST($4::int8, COALESCE(version, 0) + 1, COALESCE(logged, 0) + 1, floor + 1) AS bumped, \
                present OR logged IS NOT NULL OR floor > 0 AS requeued \
         FROM known"
    );
    let op = "requeue rows";
    let tx = timed(TIMEOUT, op, client.transaction()).await?;
    let classified = timed(
        TIMEOUT,
        op,
        tx.query(&classify, &[&schema_id, &ids, &floors, &now_ms]),
    )
    .await?;
    let mut out = Requeued::default();
    let (mut live, mut live_v, mut gone, mut gone_v) = (vec![], vec![], vec![], vec![]);
    for r in &classified {
        let (id, present, soft, bumped, requeued): (Uuid, bool, bool, i64, bool) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        match (requeued, present, soft) {
            (false, ..) => out.unknown.push(id),
            (true, true, false) => {
                out.live.push(id);
                live.push(id);
                live_v.push(bumped);
            }
            (true, true, true) => {
                out.tombstones.push(id);
                live.push(id);
                live_v.push(bumped);
            }
            (true, false, _) => {
                out.tombstones.push(id);
                gone.push(id);
                gone_v.push(bumped);
            }
        }
    }
    if dry_run {
        timed(TIMEOUT, op, tx.rollback()).await?;
        return Ok(out);
    }
    // Present rows: bump the entity's version (re-reading it under the row lock, so a write
    // that committed meanwhile is still exceeded), then the dirty slot. A row hard-deleted
    // since the classification is not there to bump: the application's delete wrote its own
    // tombstone slot, which the next flush exports.
    let present = format!(
        "WITH ids AS (SELECT * FROM unnest($2::uuid[], $3::int8[]) AS t(row_id, v)), \
         bumped AS (UPDATE {e} e SET ltbase_updated_at = GREATEST(ids.v, e.ltbase_updated_at + 1) \
            FROM ids WHERE e.ltbase_schema_id = $1 AND e.ltbase_row_id = ids.row_id \
            RETURNING e.ltbase_row_id AS row_id, e.ltbase_updated_at AS v, e.ltbase_deleted_at IS NOT NULL AS soft) \
         INSERT INTO {cl} AS cl (schema_id, row_id, flushed_at, changed_at, deleted_at) \
         SELECT $1, row_id, 0, v, CASE WHEN soft THEN v END FROM bumped \
         ON CONFLICT (schema_id, row_id, flushed_at) DO UPDATE \
            SET changed_at = EXCLUDED.changed_at, deleted_at = EXCLUDED.deleted_at \
            WHERE cl.changed_at < EXCLUDED.changed_at \
         RETURNING row_id"
    );
    // Absent rows: a tombstone slot, only while the row is still absent (a row the
    // application made again since the classification is exported from its own slot) and
    // never over a live dirty slot or a newer version: there is no row to lock, so a
    // concurrent re-creation shows only as its slot (docs/hazards.md L91).
    let absent = format!(
        "INSERT INTO {cl} AS cl (schema_id, row_id, flushed_at, changed_at, deleted_at) \
         SELECT $1, g.row_id, 0, g.v, g.v FROM unnest($2::uuid[], $3::int8[]) AS g(row_id, v) \
         WHERE NOT EXISTS (SELECT 1 FROM {e} e WHERE e.ltbase_schema_id = $1 AND e.ltbase_row_id = g.row_id) \
         ON CONFLICT (schema_id, row_id, flushed_at) DO UPDATE \
            SET changed_at = EXCLUDED.changed_at, deleted_at = EXCLUDED.deleted_at \
            WHERE cl.deleted_at IS NOT NULL AND cl.changed_at < EXCLUDED.changed_at \
         RETURNING row_id"
    );
    let mut written = std::collections::HashSet::new();
    for (sql, ids, versions) in [(&present, &live, &live_v), (&absent, &gone, &gone_v)] {
        if ids.is_empty() {
            continue;
        }
        let rows = timed(
            TIMEOUT,
            op,
            tx.query(sql.as_str(), &[&schema_id, ids, versions]),
        )
        .await?;
        written.extend(rows.iter().map(|r| r.get::<_, Uuid>(0)));
    }
    // What the application wrote meanwhile is re-exported by its own write, not requeued.
    for class in [&mut out.live, &mut out.tombstones] {
        class.retain(|id| {
            let kept = written.contains(id);
            if !kept {
                out.changed.push(*id);
            }
            kept
        });
    }
    timed(TIMEOUT, op, tx.commit()).await?;
    Ok(out)
}

/// The ids of the schema's entity rows matching `predicate` (SQL over the entity table's
/// columns), read in a read-only transaction as one statement, so the predicate can neither
/// write nor run a second statement.
pub async fn select_where(
    client: &mut Client,
    tables: &Tables,
    schema_id: i16,
    predicate: &str,
) -> Result<Vec<Uuid>> {
    // The schema's rows first, named as the table so the predicate may qualify its columns:
    // a predicate that closes its parenthesis (`true) OR (true`) cannot reach other schemas.
    let sql = format!(
        "SELECT ltbase_row_id FROM (SELECT * FROM {} WHERE ltbase_schema_id = $1) AS {} \
         WHERE ({predicate}) ORDER BY ltbase_row_id",
        tables.entity.quoted(),
        crate::config::quote_ident(tables.entity.name())
    );
    ids_read_only(client, &sql, &[&schema_id]).await
}

/// A `--where` predicate the server could not run as written (a syntax error, an unknown
/// column or function, a value of the wrong type) is the user's input, as a query's SQL error
/// is: a setting error (exit 2) with the server's message. Anything else stays as it was.
fn predicate_error(e: Error) -> Error {
    let Some(db) = (match &e {
        Error::Postgres { source, .. } => source.as_db_error(),
        _ => None,
    }) else {
        return e;
    };
    let code = db.code().code();
    match (code.starts_with("42") && code != "42501") || code.starts_with("22") {
        true => Error::setting(
            "where",
            format!("cannot be run by the source: {}", db.message()),
        ),
        false => e,
    }
}

/// The row ids statement `sql` (a `--where` selection) returns, run alone in a read-only
/// transaction that is rolled back.
pub(super) async fn ids_read_only(
    client: &mut Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Uuid>> {
    let op = "select rows to requeue (--where)";
    let tx = timed(
        TIMEOUT,
        op,
        client.build_transaction().read_only(true).start(),
    )
    .await?;
    let rows = timed(TIMEOUT, op, tx.query(sql, params))
        .await
        .map_err(predicate_error)?;
    timed(TIMEOUT, op, tx.rollback()).await?;
    rows.iter()
        .map(|r| r.try_get(0))
        .collect::<std::result::Result<_, _>>()
        .map_err(Error::postgres(op))
}
