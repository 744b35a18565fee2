//! Requeueing rows of a table source (docs/design.md §10): the capture's own contract applied
//! by lakecdc. A chosen row the table holds gets a touch carrying its key, as an `UPDATE` of
//! it would append; a chosen row the table does not hold gets a tombstone touch — when the
//! lake's copy says the row existed (a floor), else it is `unknown`, since the table keeps no
//! history of its rows. Each touch's time is above the row's floor (the version of the lake's
//! copy) and flush never hands out a version below the source's recorded floor, so the
//! re-export beats every copy in the lake. Values are never touched; the next flush reads
//! each row in its snapshot, which decides whether it is live, whatever the touch says.

use std::collections::{BTreeSet, HashMap};

use tokio_postgres::Client;
use uuid::Uuid;

use super::READ_TIMEOUT as TIMEOUT;
use super::capture::{self, RowIdRule, integer_key, integer_row_id, key_json_expr, row_id_expr};
use super::connect::timed;
use super::requeue::{CHUNK, Requeue, Requeued};
use super::table_source::TableSource;
use crate::config::quote_ident as ident;
use crate::error::Result;

/// The table's rows among `ids`: each present id with its key as the touch log stores it
/// (JSON text for a hashed key, `None` when the `row_id` holds the key). A hashed key's
/// `row_id` cannot be turned back into its key: the table is read once, every row's `row_id`
/// computed (one `md5` per row), so requeueing by id costs a table scan there.
async fn present(
    client: &Client,
    src: &TableSource,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, Option<String>>> {
    const OP: &str = "find the rows to requeue";
    let table = src.table.quoted();
    let alias = ident(src.table.name());
    let rid = row_id_expr(src.id, &src.key, &alias);
    let key = key_json_expr(&src.key, &alias);
    let mut out = HashMap::with_capacity(ids.len());
    let mut collect = |rows: Vec<tokio_postgres::Row>| -> Result<()> {
        for r in rows {
            let id: Uuid = r.try_get(0).map_err(crate::error::Error::postgres(OP))?;
            let key: Option<String> = r.try_get(1).map_err(crate::error::Error::postgres(OP))?;
            out.insert(id, key);
        }
        Ok(())
    };
    match (RowIdRule::of(&src.key), src.key.as_slice()) {
        (RowIdRule::Key, [only]) => {
            let sql = format!(
                "SELECT {rid}, {key}::text FROM ONLY {table} WHERE {alias}.{} = ANY($1::uuid[])",
                ident(&only.name)
            );
            for chunk in ids.chunks(CHUNK) {
                collect(timed(TIMEOUT, OP, client.query(&sql, &[&chunk])).await?)?;
            }
        }
        (RowIdRule::Integer, [only]) => {
            // Only ids this source's rule can produce name a key; the others are unknown.
            let keys: Vec<i64> = ids
                .iter()
                .map(|id| integer_key(*id))
                .filter(|k| ids_key_matches(src.id, *k, ids))
                .collect();
            let sql = format!(
                "SELECT {rid}, {key}::text FROM ONLY {table} WHERE {alias}.{} = ANY($1::int8[])",
                ident(&only.name)
            );
            for chunk in keys.chunks(CHUNK) {
                collect(timed(TIMEOUT, OP, client.query(&sql, &[&chunk])).await?)?;
            }
        }
        _ => {
            let sql = format!(
                "SELECT rid, key FROM (SELECT {rid} AS rid, {key}::text AS key FROM ONLY {table}) r \
                 WHERE rid = ANY($1::uuid[])"
            );
            collect(timed(TIMEOUT, OP, client.query(&sql, &[&ids])).await?)?;
        }
    }
    Ok(out)
}

/// Whether integer key `key` read back from one of `ids` is that id under source `source`'s
/// rule (an id of another source, or not of the rule's form, names no key of this table).
fn ids_key_matches(source: i16, key: i64, ids: &[Uuid]) -> bool {
    ids.binary_search(&integer_row_id(source, key)).is_ok()
}

/// Requeues `rows` of table source `src` (duplicates merged, the highest floor kept) at
/// `now_ms`, one transaction per [`CHUNK`]; with `dry_run` only classifies them.
pub async fn requeue(
    client: &mut Client,
    src: &TableSource,
    rows: &[Requeue],
    now_ms: i64,
    dry_run: bool,
) -> Result<Requeued> {
    let rows = super::requeue::merged(rows);
    let ids: Vec<Uuid> = rows.iter().map(|r| r.row_id).collect();
    let present = present(client, src, &ids).await?;
    let mut out = Requeued::default();
    // (row_id, time, gone, key JSON)
    let mut touches: Vec<(Uuid, i64, bool, Option<String>)> = Vec::with_capacity(rows.len());
    for r in &rows {
        let at = now_ms.max(r.floor.saturating_add(1));
        match present.get(&r.row_id) {
            Some(key) => {
                out.live.push(r.row_id);
                touches.push((r.row_id, at, false, key.clone()));
            }
            None if r.floor > 0 => {
                out.tombstones.push(r.row_id);
                touches.push((r.row_id, at, true, None));
            }
            None => out.unknown.push(r.row_id),
        }
    }
    if dry_run {
        return Ok(out);
    }
    // One statement number per transaction, as a capture statement draws one.
    let sql = format!(
        "INSERT INTO {log} (source_id, seq, touched_at, row_id, deleted, key) \
         SELECT $1, s.n, t.at, t.row_id, t.gone, t.key::jsonb \
         FROM (SELECT nextval({seq}::regclass) AS n) s, \
              unnest($2::uuid[], $3::int8[], $4::bool[], $5::text[]) AS t(row_id, at, gone, key)",
        log = src.touch_log().quoted(),
        seq = format_args!(
            "'{}'",
            crate::config::sql_string(&capture::touch_seq(src.touch_log()).quoted())
        ),
    );
    const OP: &str = "requeue rows";
    for chunk in touches.chunks(CHUNK) {
        let ids: Vec<Uuid> = chunk.iter().map(|t| t.0).collect();
        let at: Vec<i64> = chunk.iter().map(|t| t.1).collect();
        let gone: Vec<bool> = chunk.iter().map(|t| t.2).collect();
        let keys: Vec<Option<&str>> = chunk.iter().map(|t| t.3.as_deref()).collect();
        let tx = timed(TIMEOUT, OP, client.transaction()).await?;
        timed(
            TIMEOUT,
            OP,
            tx.execute(&sql, &[&src.id, &ids, &at, &gone, &keys]),
        )
        .await?;
        timed(TIMEOUT, OP, tx.commit()).await?;
    }
    Ok(out)
}

/// The `row_id`s of the table's rows matching `predicate` (SQL over the table's columns,
/// which it may name bare or qualified by the table's name), read in a read-only transaction
/// as one statement, so the predicate can neither write nor run a second statement.
pub async fn select_where(
    client: &mut Client,
    src: &TableSource,
    predicate: &str,
) -> Result<Vec<Uuid>> {
    let sql = format!(
        "SELECT {} AS row_id FROM ONLY {} WHERE ({predicate}) ORDER BY 1",
        row_id_expr(src.id, &src.key, &ident(src.table.name())),
        src.table.quoted()
    );
    super::requeue::ids_read_only(client, &sql, &[]).await
}

/// The ids among `ids` with a pending touch: rows the next flush exports anyway.
pub async fn pending_among(
    client: &Client,
    src: &TableSource,
    ids: &[Uuid],
) -> Result<BTreeSet<u128>> {
    // The touch log has no index: one pass over it, the ids hashed.
    let sql = format!(
        "SELECT DISTINCT row_id FROM {} WHERE source_id = $1 AND row_id = ANY($2::uuid[])",
        src.touch_log().quoted()
    );
    let rows = timed(
        TIMEOUT,
        "read pending row ids",
        client.query(&sql, &[&src.id, &ids]),
    )
    .await?;
    Ok(rows.iter().map(|r| r.get::<_, Uuid>(0).as_u128()).collect())
}

/// The ids among `ids` the table holds right now. For a hashed key this reads the whole
/// table (see [`present`]); gc's settling asks only about the few rows the lake no longer holds.
pub async fn live_among(
    client: &Client,
    src: &TableSource,
    ids: &[Uuid],
) -> Result<BTreeSet<u128>> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    Ok(present(client, src, &sorted)
        .await?
        .into_keys()
        .map(|id| id.as_u128())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ids_of_the_sources_integer_rule_name_a_key() {
        let mut ids = vec![integer_row_id(3, 42), integer_row_id(4, 7), Uuid::new_v4()];
        ids.sort();
        assert!(ids_key_matches(3, 42, &ids));
        // Source 4's id reads back key 7, which under source 3's rule is another id.
        assert!(!ids_key_matches(3, 7, &ids));
        let stray = ids
            .iter()
            .find(|i| **i != integer_row_id(3, 42) && **i != integer_row_id(4, 7));
        assert!(!ids_key_matches(3, integer_key(*stray.unwrap()), &ids));
    }
}
