//! `change_log` statistics: which schemas have dirty rows, how many, and how old.

use tokio_postgres::Client;

use super::connect::timed;
use crate::config::TableName;
use crate::error::Result;

/// Dirty-row statistics of one schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirtyStats {
    /// Rows with `flushed_at = 0`.
    pub count: i64,
    /// The smallest dirty `changed_at` (epoch ms), 0 when none.
    pub oldest_changed_at: i64,
}

/// Counts the dirty rows of `schema_id` (uses the `(schema_id, flushed_at, changed_at)` index).
pub async fn dirty(client: &Client, change_log: &TableName, schema_id: i16) -> Result<DirtyStats> {
    let sql = format!(
        "SELECT COUNT(*), COALESCE(MIN(changed_at), 0) FROM {} WHERE schema_id = $1 AND flushed_at = 0",
        change_log.quoted()
    );
    let row = timed(
        std::time::Duration::from_secs(300),
        "read change_log stats",
        client.query_one(&sql, &[&schema_id]),
    )
    .await?;
    Ok(DirtyStats {
        count: row.get(0),
        oldest_changed_at: row.get(1),
    })
}

/// The schemas that have at least one dirty row.
///
/// `change_log` keeps every flushed slot forever, so a plain `DISTINCT ... WHERE flushed_at = 0`
/// scans the whole history on every run (an idle per-minute flush would read a table that only
/// grows). Instead the distinct schema ids are walked through the index (one descent per id, a
/// "skip scan") and each is probed for a dirty slot: the cost grows with the number of schemas,
/// not rows.
pub async fn dirty_schemas(client: &Client, change_log: &TableName) -> Result<Vec<i16>> {
    let t = change_log.quoted();
    let sql = format!(
        "WITH RECURSIVE ids(id) AS ( \
             SELECT min(schema_id) FROM {t} \
             UNION ALL \
             SELECT (SELECT min(c.schema_id) FROM {t} c WHERE c.schema_id > ids.id) \
             FROM ids WHERE ids.id IS NOT NULL) \
         SELECT id FROM ids WHERE id IS NOT NULL \
         AND EXISTS (SELECT 1 FROM {t} c WHERE c.schema_id = ids.id AND c.flushed_at = 0) \
         ORDER BY id"
    );
    let rows = timed(
        std::time::Duration::from_secs(300),
        "list dirty schemas",
        client.query(&sql, &[]),
    )
    .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
