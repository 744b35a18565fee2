//! The source tables' DDL (docs/design.md §2 and §2.1) and schema registration, for `init-db`.
//! Everything runs in one transaction under a transaction-scoped advisory lock, so concurrent
//! `init-db` runs serialise instead of racing on `CREATE TABLE IF NOT EXISTS`.

use tokio_postgres::{Client, GenericClient};

use super::connect::timed;
use crate::config::{TableName, Tables};
use crate::error::{Error, Result};
use crate::schema::slot_columns;

/// Lock key serialising `init-db` runs (single-bigint keyspace, disjoint from schema locks).
pub(crate) const INIT_DB_LOCK: i64 = 0x6c61_6b65_6364_6301;
/// The first id given to a schema in an empty registry.
pub const FIRST_SCHEMA_ID: i16 = 100;
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// What `init-db` did to one object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ObjectStatus {
    /// The table or index name.
    pub name: String,
    /// True when this run created it.
    pub created: bool,
}

/// A schema's registration outcome.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Registration {
    /// Schema name.
    pub name: String,
    /// Its id.
    pub id: i16,
    /// True when this run registered it.
    pub created: bool,
}

/// The `CREATE TABLE` statements, in creation order, with the table they create.
pub fn table_ddl(t: &Tables) -> Vec<(&TableName, String)> {
    let slots: String = slot_columns()
        .iter()
        .map(|(name, ty)| format!("    {name} {},\n", ty.sql()))
        .collect();
    vec![
        (
            &t.registry,
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n    schema_name TEXT PRIMARY KEY,\n    schema_id SMALLINT UNIQUE NOT NULL\n)",
                t.registry.quoted()
            ),
        ),
        (
            &t.entity,
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n    ltbase_schema_id SMALLINT NOT NULL,\n    ltbase_row_id UUID NOT NULL,\n{slots}    ltbase_created_at BIGINT NOT NULL,\n    ltbase_updated_at BIGINT NOT NULL,\n    ltbase_deleted_at BIGINT,\n    ltbase_created_by TEXT,\n    ltbase_updated_by TEXT,\n    ltbase_deleted_by TEXT,\n    PRIMARY KEY (ltbase_schema_id, ltbase_row_id)\n)",
                t.entity.quoted()
            ),
        ),
        (
            &t.eav,
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n    schema_id SMALLINT NOT NULL,\n    row_id UUID NOT NULL,\n    attr_id SMALLINT NOT NULL,\n    array_indices TEXT NOT NULL DEFAULT '',\n    value_text TEXT,\n    value_numeric DOUBLE PRECISION,\n    PRIMARY KEY (schema_id, row_id, attr_id, array_indices)\n)",
                t.eav.quoted()
            ),
        ),
        (
            &t.change_log,
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n    schema_id SMALLINT NOT NULL,\n    row_id UUID NOT NULL,\n    flushed_at BIGINT NOT NULL DEFAULT 0,\n    changed_at BIGINT NOT NULL,\n    deleted_at BIGINT,\n    PRIMARY KEY (schema_id, row_id, flushed_at)\n)",
                t.change_log.quoted()
            ),
        ),
    ]
}

/// The `CREATE INDEX` statement of the `change_log` index. It holds the dirty slots only
/// (`WHERE flushed_at = 0`, docs/design.md §2.1): every query that uses it asks for dirty
/// slots, a mark's new version of a slot gets no entry (one index insert fewer per flushed
/// row), and the index stays the size of the backlog while `change_log` keeps every flushed
/// slot forever.
pub fn change_log_index_ddl(t: &Tables) -> String {
    format!(
        "CREATE INDEX IF NOT EXISTS {} ON {} {DIRTY_INDEX_SHAPE}",
        change_log_index(t),
        t.change_log.quoted()
    )
}

/// The columns and predicate of the `change_log` index.
const DIRTY_INDEX_SHAPE: &str = "(schema_id, flushed_at, changed_at) WHERE flushed_at = 0";

/// The statements that replace a whole-table index `old` (a qualified, quoted name) with one of
/// the dirty slots only, without blocking the application's writes.
pub fn dirty_index_migration(t: &Tables, old: &str) -> String {
    format!(
        "CREATE INDEX CONCURRENTLY {} ON {} {DIRTY_INDEX_SHAPE}; DROP INDEX CONCURRENTLY {old};",
        t.change_log.derived("dirty_slots_idx"),
        t.change_log.quoted()
    )
}

/// The DDL `init-db` runs on an empty database (`init-db --print-sql`), for teams that apply
/// migrations with their own tool: every statement is idempotent (`IF NOT EXISTS`), in
/// creation order, each ending with `;`. Schemas are registered by `init-db` itself (their ids
/// depend on the registry's contents).
pub fn script(t: &Tables) -> String {
    let mut out = String::from(
        "-- lakecdc init-db: the source tables and the change_log index (docs/design.md §2.1).\n\
         -- Idempotent; register schemas afterwards with `lakecdc init-db --schema-dir DIR`.\n",
    );
    for (_, sql) in table_ddl(t) {
        out.push_str(&sql);
        out.push_str(";\n");
    }
    out.push_str(&change_log_index_ddl(t));
    out.push_str(";\n");
    out
}

/// The name of the `change_log (schema_id, flushed_at, changed_at)` index.
pub fn change_log_index(t: &Tables) -> String {
    t.change_log.derived("dirty_idx")
}

/// What a missing `change_log` index means and how to mend it (inspect's warning, doctor's
/// failed check).
pub fn change_log_index_missing(t: &Tables) -> String {
    format!(
        "{} has no (schema_id, flushed_at, changed_at) index: flush scans the table; run init-db to create it",
        t.change_log.quoted()
    )
}

/// How `change_log`'s dirty slots are indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirtyIndex {
    /// A valid index leading with `(schema_id, flushed_at)` of the dirty slots only
    /// (`WHERE flushed_at = 0`), as `init-db` creates it.
    DirtyOnly,
    /// A valid index leading with `(schema_id, flushed_at)` without a predicate: it serves
    /// flush, but every mark adds an entry for the flushed slot too. Its qualified name.
    WholeTable(String),
    /// No valid index flush can use.
    Missing,
}

/// How `change_log`'s dirty slots are indexed: the best valid index leading with
/// `(schema_id, flushed_at)`, whatever its name. A partial index with another predicate, or an
/// index a failed `CREATE INDEX CONCURRENTLY` left invalid, does not count.
pub async fn change_log_dirty_index(client: &impl GenericClient, t: &Tables) -> Result<DirtyIndex> {
    let rows = timed(
        TIMEOUT,
        "check change_log index",
        client.query(
            "SELECT format('%I.%I', n.nspname, c.relname), pg_get_expr(i.indpred, i.indrelid) \
             FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_attribute a1 ON a1.attrelid = i.indrelid AND a1.attnum = i.indkey[0] \
             JOIN pg_attribute a2 ON a2.attrelid = i.indrelid AND a2.attnum = i.indkey[1] \
             WHERE i.indrelid = to_regclass($1) AND i.indisvalid \
             AND a1.attname = 'schema_id' AND a2.attname = 'flushed_at' \
             ORDER BY 1",
            &[&t.change_log.quoted()],
        ),
    )
    .await?;
    let mut found = DirtyIndex::Missing;
    for row in rows {
        match row.get::<_, Option<String>>(1).as_deref() {
            Some("(flushed_at = 0)") => return Ok(DirtyIndex::DirtyOnly),
            None if found == DirtyIndex::Missing => found = DirtyIndex::WholeTable(row.get(0)),
            _ => {}
        }
    }
    Ok(found)
}

/// True when `change_log` has an index flush can use (see [`change_log_dirty_index`]).
pub async fn change_log_index_exists(client: &impl GenericClient, t: &Tables) -> Result<bool> {
    Ok(change_log_dirty_index(client, t).await? != DirtyIndex::Missing)
}

/// The names and ids table sources hold: none before the first `attach`.
pub(crate) async fn sources(
    client: &impl GenericClient,
    tables: &Tables,
) -> Result<Vec<(String, i16)>> {
    let sources = tables.sources();
    let exists: bool = timed(
        TIMEOUT,
        "check table",
        client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&sources.quoted()]),
    )
    .await?
    .get(0);
    if !exists {
        return Ok(Vec::new());
    }
    let sql = format!("SELECT name, source_id FROM {}", sources.quoted());
    timed(TIMEOUT, "read lakecdc_sources", client.query(&sql, &[]))
        .await?
        .iter()
        .map(|r| {
            let column = |c: &'static str| Error::postgres(format!("read lakecdc_sources: {c}"));
            Ok((
                r.try_get(0).map_err(column("name"))?,
                r.try_get(1).map_err(column("source_id"))?,
            ))
        })
        .collect()
}

/// Creates whatever is missing and registers `schema_names` (sorted by the caller); existing
/// names keep their id, new names get `max(FIRST_SCHEMA_ID, max id + 1)` onwards. With
/// `dry_run` the same checks and id assignment run in a transaction that changes nothing and
/// is rolled back: the report is the plan a real run would follow.
pub async fn apply(
    client: &mut Client,
    t: &Tables,
    schema_names: &[String],
    dry_run: bool,
) -> Result<(Vec<ObjectStatus>, Vec<Registration>)> {
    let tx = timed(TIMEOUT, "begin init-db", client.transaction()).await?;
    timed(
        TIMEOUT,
        "lock init-db",
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&INIT_DB_LOCK]),
    )
    .await?;
    let mut objects = Vec::new();
    for (table, sql) in table_ddl(t) {
        let exists = timed(
            TIMEOUT,
            "check table",
            tx.query_one("SELECT to_regclass($1) IS NOT NULL", &[&table.quoted()]),
        )
        .await?
        .get::<_, bool>(0);
        if !exists && !dry_run {
            timed(TIMEOUT, "create table", tx.batch_execute(&sql)).await?;
        }
        objects.push(ObjectStatus {
            name: table.quoted(),
            created: !exists,
        });
    }
    let index_sql_exists = change_log_index_exists(&tx, t).await?;
    if !index_sql_exists && !dry_run {
        let sql = change_log_index_ddl(t);
        timed(TIMEOUT, "create change_log index", tx.batch_execute(&sql)).await?;
    }
    objects.push(ObjectStatus {
        name: change_log_index(t),
        created: !index_sql_exists,
    });

    // A dry run over a registry it would create reads none.
    let registry_missing = objects
        .iter()
        .any(|o| o.created && o.name == t.registry.quoted());
    let existing: Vec<(String, i16)> = if dry_run && registry_missing {
        Vec::new()
    } else {
        timed(
            TIMEOUT,
            "read schema registry",
            tx.query(
                &format!("SELECT schema_name, schema_id FROM {}", t.registry.quoted()),
                &[],
            ),
        )
        .await?
        .iter()
        .map(|r| {
            // A registry table of another shape is an error, not a panic.
            let column = |c: &'static str| Error::postgres(format!("read schema registry: {c}"));
            Ok((
                r.try_get(0).map_err(column("schema_name"))?,
                r.try_get(1).map_err(column("schema_id"))?,
            ))
        })
        .collect::<Result<_>>()?
    };
    // Table sources share the schemas' ids (docs/design.md §9).
    let sources = sources(&tx, t).await?;
    let mut next = existing
        .iter()
        .chain(sources.iter())
        .map(|(_, id)| *id)
        .map(|id| i32::from(id) + 1)
        .max()
        .unwrap_or(0)
        .max(i32::from(FIRST_SCHEMA_ID));
    let insert = format!(
        "INSERT INTO {} (schema_name, schema_id) VALUES ($1, $2) ON CONFLICT (schema_name) DO NOTHING",
        t.registry.quoted()
    );
    let mut registrations = Vec::new();
    for name in schema_names {
        if let Some((_, id)) = existing.iter().find(|(n, _)| n == name) {
            registrations.push(Registration {
                name: name.clone(),
                id: *id,
                created: false,
            });
            continue;
        }
        // A schema and a table source never share a name: `--schema NAME` names one of them.
        if sources.iter().any(|(n, _)| n == name) {
            return Err(Error::config(format!(
                "cannot register schema {name:?}: a table source has that name (lakecdc attach); rename the schema's files"
            )));
        }
        let id = i16::try_from(next).map_err(|_| {
            Error::config(format!(
                "cannot register schema {name:?}: schema ids are exhausted (max {})",
                i16::MAX
            ))
        })?;
        if !dry_run {
            timed(
                TIMEOUT,
                "register schema",
                tx.execute(&insert, &[name, &id]),
            )
            .await?;
        }
        registrations.push(Registration {
            name: name.clone(),
            id,
            created: true,
        });
        next += 1;
    }
    if dry_run {
        timed(TIMEOUT, "end init-db dry run", tx.rollback()).await?;
    } else {
        timed(TIMEOUT, "commit init-db", tx.commit()).await?;
    }
    Ok((objects, registrations))
}
